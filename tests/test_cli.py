import subprocess
import sys

from tfopt.__main__ import main


def test_console_script_dispatch(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("train", "distill", "optimize", "export", "federated", "pipeline", "launch"):
        assert f"  {command} " in out, out  # every command with its one-line purpose
    assert main(["deploy"]) == 2
    assert (
        "unknown command 'deploy'; choose one of train, distill, optimize, export, federated, pipeline"
        in capsys.readouterr().err
    )
    assert main(["trian"]) == 2
    assert "unknown command 'trian'; did you mean 'train'? choose one of" in capsys.readouterr().err
    from tfopt._version import __version__

    assert main(["--version"]) == 0 and capsys.readouterr().out == f"tfopt {__version__}\n"


def test_console_script_runs_a_subcommand():
    proc = subprocess.run(
        [sys.executable, "-m", "tfopt", "train", "--print-config", "--epochs", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"epochs": 4' in proc.stdout
