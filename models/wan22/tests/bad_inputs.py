"""Bad input to ``trnmodels video``: what the user adds to a valid command line, and the part of the one-line
error they get (exit 2, nothing started, nothing written). Data only: ``test_video_cli.py`` runs every case
on the tiny text-to-video checkpoint, from a folder holding ``clips.mp4/`` (a directory), ``notes.txt`` (a
text file) and the command's own ``out.mp4``; ``docs/bad-inputs.md`` renders the list. A ``#`` starts a
remark that is not part of the command line."""

from trnmodels.core.testing.bad_inputs import BadInput, numeric_flag_cases

BAD_INPUTS = [
    # Sizes the VAE and the DiT cannot take (checked against the checkpoint's configs before any rank starts).
    BadInput("video", "--num-frames 6", "num_frames=6 is not of the form 4k+1"),
    BadInput("video", "--height 40", "height=40 is not divisible by 16"),
    BadInput("video", "--width 32.5", "argument --width: expected a positive integer, got '32.5'"),
    # Every numeric flag: the values just outside what its type accepts (--steps 0, --seed -1, ...). Floats
    # must be finite too: nan compares false with every bound, and used to switch guidance off.
    *numeric_flag_cases("video"),
    # The mesh, checked against the checkpoint's component configs before any rank starts.
    BadInput(
        "video",
        "--cfg-parallel 3",
        "cfg_parallel_size=3: classifier-free guidance has 2 branches, use 1 or 2",
    ),
    BadInput(
        "video",
        "--cfg-parallel 2 --guidance-scale 1",
        "cfg_parallel_size=2 needs classifier-free guidance, but guidance is disabled",
    ),
    BadInput(
        "video",
        "--tp 3  # the DiT has 2 attention heads",
        "transformer/config.json: num_attention_heads=2 is not divisible by tp_degree=3",
    ),
    BadInput(
        "video",
        "--cp 3  # a 5x32x32 video is 8 DiT tokens",
        "the video's 8 latent tokens are not divisible by cp_degree=3",
    ),
    BadInput("video", "--vae-patch-parallel 2", "--vae-patch-parallel 2 exceeds the 1 rank(s) of the mesh"),
    BadInput("video", "--ring-attention", "--ring-attention applies to context parallelism: it needs --cp 2"),
    BadInput("video", "--no-ring-attention", "--no-ring-attention applies to context parallelism"),
    # Files.
    BadInput("video", "--image missing.png", "--image: missing.png is not a file"),
    BadInput("video", "--image notes.txt", "--image: notes.txt is not an image"),
    BadInput("video", "--out clips.mp4  # clips.mp4 is a directory", "--out: clips.mp4 is a directory"),
    BadInput("video", "--out clip.avi", "--out: expected an .mp4 file, got clip.avi"),
    BadInput("video", "--out missing/clip.mp4", "--out: directory missing does not exist"),
    BadInput("video", "--out notes.txt/clip.mp4", "--out: notes.txt is not a directory"),
    BadInput("video", "--latents-out clips.mp4", "--latents-out: clips.mp4 is a directory"),
    BadInput("video", "--latents-out out.mp4  # the --out file", "--latents-out: out.mp4 is also --out"),
]
