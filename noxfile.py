"""Nox sessions for the trnmodels monorepo.

Every session that runs code installs it from ``uv.lock`` (``uv sync --locked``), so
tests run against exactly the locked versions. Sessions per member are generated from
``core/`` and every ``models/*/pyproject.toml``; a new model folder needs no edit here.

Sessions:
    tests            core and all models in one pytest run (extra pytest args: ``-- ARGS``)
    tests-core       pytest core/tests
    tests-<model>    pytest models/<model>/tests
    build-core       wheel + sdist of trnmodels-core into dist/
    build-<model>    wheel + sdist of that model's distribution into dist/
    compile-<model>  AOT-compile every bucket graph of the plugin's tiny config (or `-- PATH`)
    bench-<model>    benchmark the plugin's bench config into docs/benchmarks/<model>.md/.json/.png
                     (loading, throughput vs HF, roofline, compile time; `-- --quick` for a smoke run)
    lint             ruff check . && ruff format --check .
    demo             python -m trnmodels.llama3.demo (extra args passed through)

``nox`` alone runs ``tests`` and ``lint``. Use ``nox -r`` to reuse environments (the sync
is then a quick no-op) or ``nox -R`` to skip the sync entirely.
"""

import tomllib
from collections.abc import Sequence
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint"]

ROOT = Path(__file__).resolve().parent
# member short name ("core", "llama3", ...) -> member folder, relative to the repo root
MEMBERS = {"core": Path("core")} | {
    p.parent.name: p.parent.relative_to(ROOT) for p in sorted(ROOT.glob("models/*/pyproject.toml"))
}


def _distribution(member: Path) -> str:
    with open(ROOT / member / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["name"]


def _sync(session: nox.Session, groups: Sequence[str] = ("dev",)) -> None:
    """Install the whole workspace plus the given dependency groups from the lock into the session venv."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--all-packages",
        *(arg for group in groups for arg in ("--group", group)),
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )


def _pytest(session: nox.Session, *paths: Path) -> None:
    _sync(session)
    session.run("pytest", *map(str, paths), *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the tests of core and all models in one pytest run."""
    _pytest(session, *(member / "tests" for member in MEMBERS.values()))


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
            target = session.posargs or [str(ROOT / member / "src" / "trnmodels" / name / "tiny")]
            session.run("trnmodels", "compile", *target, "--jobs", "2")

        @nox.session(name=f"bench-{name}")
        def member_bench(session: nox.Session) -> None:
            _sync(session, groups=("dev", "bench"))
            session.run(
                "python", "-m", "trnmodels.core.bench", name, "--out-dir", "docs/benchmarks", *session.posargs
            )

        member_bench.__doc__ = (
            f"Benchmark {name} on its ~100M-parameter bench config into docs/benchmarks/{name}.md/.json/.png."
        )

    @nox.session(name=f"build-{name}", python=False)
    def member_build(session: nox.Session) -> None:
        session.run("uv", "build", "--package", dist, "--out-dir", "dist/")

    member_tests.__doc__ = f"Run {member}/tests."
    member_build.__doc__ = f"Build the {dist} wheel and sdist into dist/."


for _name, _member in MEMBERS.items():
    _make_member_sessions(_name, _member)


@nox.session
def lint(session: nox.Session) -> None:
    """Lint and check formatting with the locked ruff."""
    _sync(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """Build a tiny random Llama checkpoint, load it through the plugin, print a report."""
    _sync(session)
    session.run("python", "-m", "trnmodels.llama3.demo", *session.posargs)
