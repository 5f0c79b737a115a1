"""Shared command-line plumbing: one-line errors, exit code 2, config flags."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Collection

from tfopt import config as config_lib
from tfopt.core import flagcheck, log
from tfopt.core.errors import ConfigError, TfoptError


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message):  # noqa: D102 - argparse hook
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _choices(names) -> str:
    return "{" + ",".join(names) + "}"


#: The help groups of the config flags, in the order ``--help`` shows them.
GROUPS = (
    "configuration",
    "distillation",
    "optimization",
    "pruning",
    "clustering",
    "low-rank factorization",
    "channel pruning",
    "conversion (--from)",
    "fidelity gate (--from)",
    "on-device training (--from)",
    "federated",
    "evaluation",
    "latency",
    "data",
    "model",
    "distribution",
    "fine-tuning",
    "training",
    "privacy",
    "output",
)
#: A section's help group, unless its field's :class:`~tfopt.config.Flag` names another.
SECTION_GROUPS = {
    "distill": "distillation",
    "optimize": "optimization",
    "export": "conversion (--from)",
    "data": "data",
    "model": "model",
    "runtime": "distribution",
    "train": "training",
    "privacy": "privacy",
    "federated": "federated",
}
TRAINING = config_lib.TRAINING_SECTIONS


def config_flags(
    sections: tuple[str, ...] | None = None,
) -> list[tuple[str, dataclasses.Field, config_lib.Flag]]:
    """``(section, field, flag)`` of every RunConfig field that has a command-line option.

    Args:
        sections: Only these sections (default: every one).
    """
    out = []
    for section in dataclasses.fields(config_lib.RunConfig):
        if sections is not None and section.name not in sections:
            continue
        for f in dataclasses.fields(_section_type(section.name)):
            if config_lib.FLAG in f.metadata:
                out.append((section.name, f, f.metadata[config_lib.FLAG]))
    return out


def _section_type(name: str) -> type:
    return type(getattr(config_lib.RunConfig(), name))


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _option_kwargs(section: str, f: dataclasses.Field, flag: config_lib.Flag, value) -> dict:
    """argparse's keywords for one config field's option (its default shown, never set: a
    flag not given leaves the config's value, whichever file or ``--set`` gave it)."""
    typ = config_lib._field_types(_section_type(section))[f.name]
    kwargs: dict = {"dest": _dest(flag.name), "help": flag.help}
    negated = typ is bool and flag.name.startswith("--no-")
    if value not in ("", None) and "default" not in flag.help and not negated:
        shown = "off" if value is False else "on" if value is True else value
        kwargs["help"] += f" (default: {shown})"
    if negated:  # e.g. --no-tensorboard sets optimize.tensorboard to false
        return kwargs | {"action": "store_const", "const": False, "default": None}
    if typ is bool:
        return kwargs | {"action": "store_true", "default": None}
    kwargs["type"] = typ if typ in (int, float) else str
    choices = config_lib.choices_of(section, f.name)
    if flag.choices:
        kwargs["choices"] = flag.choices
    kwargs["metavar"] = flag.metavar or (
        _choices(choices) if choices and not flag.choices else None
    )
    if flag.repeat:
        kwargs.update(action="append", default=None)
    return kwargs


def add_config_args(
    parser: argparse.ArgumentParser,
    sections: tuple[str, ...] = TRAINING,
    *,
    shared: tuple[str, ...] = (),
    inherited: str = "",
) -> None:
    """Adds the flags of the config ``sections``, generated from the fields of
    :class:`~tfopt.config.RunConfig` that carry a :class:`~tfopt.config.Flag`: grouped (the
    stage's own, data, model, distribution, training, output), each help ending with the field's
    default, choice lists shown from the config's own (``--config``, ``--set``,
    ``--print-config`` come first). :func:`config_from_args` reads them back.

    Args:
        parser: The command's parser.
        sections: The config sections the command reads (default: the training ones).
        shared: ``SECTION.KEY`` of single fields of other sections it reads too (a stage that
            starts from a run reads only some of the run's settings).
        inherited: Where the ``shared`` fields' defaults come from, e.g. ``the input run's``
            (default: the config's defaults, shown in each help).
    """
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    g = groups["configuration"]
    g.add_argument(
        "--config",
        metavar="FILE",
        help="YAML or JSON config file (a run's config.yaml too); flags override its values",
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config value, e.g. --set data.cache=none (repeatable)",
    )
    g.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )
    defaults = config_lib.RunConfig()
    keys = {}
    chosen = [
        (s, f, fl) for s, f, fl in config_flags() if s in sections or f"{s}.{f.name}" in shared
    ]
    for section, f, flag in chosen:
        value = getattr(getattr(defaults, section), f.name)
        kwargs = _option_kwargs(section, f, flag, "" if section not in sections else value)
        if section not in sections and inherited and "default" not in flag.help:
            kwargs["help"] += f" (default: {inherited})"
        groups[flag.group or SECTION_GROUPS[section]].add_argument(
            flag.name, *flag.aliases, **kwargs
        )
        keys[kwargs["dest"]] = (section, f.name)
    parser.set_defaults(config_keys=keys)
    if "model" in sections:
        groups["model"].add_argument(
            "--model-arg",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a keyword argument of keras.applications:NAME or a factory, e.g. alpha=0.35, "
            "weights=None (default), weights=imagenet (downloads), weights=PATH (repeatable)",
        )
    if "runtime" in sections or any(k.startswith("runtime.") for k in shared):
        add_shard_variables(groups["distribution"])
    g = groups["output"]
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished run at -o, or discard an unfinished run of other settings there",
    )
    add_verbosity(g, "no progress bar")


def group(parser: argparse.ArgumentParser, title: str):
    """The argument group of ``parser`` titled ``title`` (one :func:`add_config_args` made)."""
    return next(g for g in parser._action_groups if g.title == title)


def flag_keys(sections: tuple[str, ...] = TRAINING) -> dict[str, tuple[str, str]]:
    """Option dest -> ``(section, key)`` of every config flag of ``sections`` (stages' sections
    may reuse a name: ``--epochs`` is ``train.epochs`` and ``optimize.epochs``)."""
    return {_dest(flag.name): (section, f.name) for section, f, flag in config_flags(sections)}


def config_from_args(
    args: argparse.Namespace, base: config_lib.RunConfig | None = None
) -> config_lib.RunConfig:
    """Resolves the config: ``base`` (default: the defaults) < --config file < --set overrides
    < dedicated flags (those :func:`add_config_args` added).

    Raises:
        ConfigError: a bad value, or a ``package.module:function`` model the ``--config`` file
            names (code read from a file) without ``--trust-model``.
    """
    from_file = config_lib.load(args.config, base) if args.config else None
    cfg = config_lib.apply_overrides(from_file or base or config_lib.RunConfig(), args.set)
    raw: dict[str, dict] = {}
    for flag, (section, key) in getattr(args, "config_keys", flag_keys()).items():
        value = getattr(args, flag, None)
        if isinstance(value, list):  # a repeatable option: its values comma-joined
            value = ",".join(value)
        if value is not None:
            raw.setdefault(section, {})[key] = value
    raw.setdefault("runtime", {}).update(shard_variables(args))
    if getattr(args, "model_arg", None):
        raw.setdefault("model", {})["args"] = ",".join(args.model_arg)
    if getattr(args, "quiet", False):
        raw.setdefault("train", {})["verbose"] = 0
    cfg = config_lib.from_dict(raw, cfg)
    if from_file is not None and cfg.model.name == from_file.model.name:
        # typed on the command line (--model, --set model.name=...) it is the user's intent
        typed = getattr(args, "model", None) is not None or any(
            s.strip().startswith("model.name=") for s in (args.set or [])
        )
        if not typed:
            check_code_trust(cfg.model, f"--config {args.config}")
    return cfg


def check_read(
    cfg: config_lib.RunConfig, given: Collection[str], sections: tuple[str, ...]
) -> None:
    """Refuses an option of ``sections`` that the value its section is chosen by does not read.

    What reads a field is its :attr:`~tfopt.config.Flag.read_by` (e.g. ``--sparsity`` by
    ``--technique prune``); the chooser is the section's ``CHOSEN_BY`` field.

    Raises:
        ConfigError: e.g. ``--sparsity is not used by --technique cluster (it belongs to prune);
            give --technique prune, or drop --sparsity``.
    """
    for section in sections:
        values = getattr(cfg, section)
        flags = {f.name: flag for s, f, flag in config_flags((section,))}
        for chooser in config_lib.choosers(type(values)):
            choices = set(flags[chooser].choices or config_lib.choices_of(section, chooser) or ())
            chosen = getattr(values, chooser)
            users = {
                flag.name: flag.read_by
                for flag in flags.values()
                if flag.read_by and set(flag.read_by) <= choices
            }
            own = [name for name, readers in users.items() if chosen in readers]
            takes = f"{chosen} takes {flagcheck.join(own)}; " if own else ""
            option = flags[chooser].name
            flagcheck.refuse_unused(
                users,
                (chosen,),
                given,
                chosen_as=f"{option} {chosen}",
                fix=lambda flag, readers, option=option, takes=takes: (
                    f"{takes}give {option} {flagcheck.join(readers)}, or drop {flag}"
                ),
            )


def check_code_trust(model: config_lib.ModelConfig, where: str) -> None:
    """Refuses a ``package.module:function`` model read from a file unless ``model.trust`` allows code.

    A factory string is code: importing its module runs it. Typed on the command line it is the
    user's intent; read from a file (a config, a run's record), it needs the same trust as a
    Lambda layer. Checked before anything is imported.

    Raises:
        ConfigError: a factory model from ``where`` without ``--trust-model``.
    """
    from tfopt.core.specs import parse_model_source

    if model.trust or parse_model_source(model.name).form != "factory":
        return
    raise ConfigError(
        f"model.name={model.name[:80]!r} from {where[:120]} is code (a package.module:function "
        "factory: importing it runs that module); give --trust-model if you trust that file, or "
        "name the model with --model on the command line"
    )


def add_shard_variables(group) -> None:
    """Adds ``--shard-variables MIN_SHARD_MB`` (parameter_server; see :mod:`tfopt.runtime.sharding`)."""
    group.add_argument(
        "--shard-variables",
        type=float,
        metavar="MIN_SHARD_MB",
        help="parameter_server: split each variable of at least 2 x MIN_SHARD_MB MiB into shards "
        "of at least MIN_SHARD_MB over the ps tasks (one shard per ps task at most)",
    )


def shard_variables(args: argparse.Namespace) -> dict:
    """The ``runtime`` settings ``--shard-variables`` gives (none when it is not given).

    Raises:
        ConfigError: a size that is not positive.
    """
    mb = getattr(args, "shard_variables", None)
    if mb is None:
        return {}
    if not mb > 0:
        raise ConfigError(
            f"--shard-variables {mb:g}: give the smallest shard size in MiB, a number > 0 "
            "(e.g. --shard-variables 1)"
        )
    return {"variable_partitioner": "min_size", "min_shard_bytes": max(1, round(mb * (1 << 20)))}


def check_config_flags(cfg: config_lib.RunConfig, given: Collection[str]) -> None:
    """Refuses a distribution or data flag the resolved config does not read.

    ``--cpu-replicas`` is read by ``mirrored`` only, ``--collective`` by
    ``multi_worker_mirrored`` only and ``--data-service-mode`` only with a tf.data service.

    Args:
        cfg: The resolved config (its strategy may come from ``--config`` or an input run).
        given: The options given explicitly (:func:`tfopt.core.flagcheck.explicit`).

    Raises:
        ConfigError: e.g. ``--cpu-replicas is not used with --strategy one_device (it needs
            --strategy mirrored); give --strategy mirrored, or drop --cpu-replicas``.
    """
    strategy = f"--strategy {cfg.runtime.strategy}"
    flagcheck.refuse_off(
        {
            "--cpu-replicas": (
                cfg.runtime.strategy == "mirrored",
                strategy,
                "--strategy mirrored",
                None,
            ),
            "--collective": (
                cfg.runtime.strategy == "multi_worker_mirrored",
                strategy,
                "--strategy multi_worker_mirrored",
                None,
            ),
            "--data-service-mode": (
                bool(cfg.data.service),
                "no --data-service",
                "--data-service local or grpc://HOST:PORT",
                None,
            ),
        },
        given,
    )
    check_read(cfg, given, ("runtime",))  # e.g. --stages by --strategy pipeline only


def add_verbosity(group, quiet_help: str) -> None:
    """Adds ``--quiet`` (``quiet_help``; events and warnings still print) and ``--verbose``."""
    group.add_argument("--quiet", action="store_true", help=quiet_help)
    group.add_argument("--verbose", action="store_true", help="debug lines too")


def verbosity(args: argparse.Namespace) -> int:
    """The logging level ``--quiet`` and ``--verbose`` ask for (``--quiet`` wins)."""
    if getattr(args, "quiet", False):
        return log.QUIET
    return log.VERBOSE if getattr(args, "verbose", False) else log.NORMAL


def os_error_fix(e: OSError) -> str | None:
    """The fix for an OS error the machine gives on the user's paths (a full disk, a read-only
    or forbidden directory, a name too long, a directory where a file belongs), else None."""
    import errno

    return {
        errno.ENOSPC: "free space on that disk, or give -o / --data-dir on another",
        errno.EDQUOT: "free space within your quota, or give -o / --data-dir elsewhere",
        errno.EROFS: "that file system is read-only: give -o on a writable one",
        errno.EACCES: "you may not write or read there: fix its permissions or give another path",
        errno.EPERM: "you may not write or read there: fix its permissions or give another path",
        errno.ENAMETOOLONG: "a name in that path is too long (at most 255 bytes): shorten it",
        errno.EISDIR: "that is a directory where a file belongs: give the file's path",
        errno.ENOTDIR: "a part of that path is a file where a directory belongs: fix the path",
        errno.ELOOP: "that path is a loop of symbolic links: fix the link",
    }.get(e.errno)


#: The longest error line a command prints.
MAX_ERROR_CHARS = 2000


def run_main(prog: str, fn: Callable[[], int], level: int = log.NORMAL) -> int:
    """Runs a CLI body with tfopt's logging configured (:func:`tfopt.core.log.configure`), turning a
    TfoptError into one line on stderr and exit code 2."""
    log.configure(prog, level)
    try:
        return fn()
    except TfoptError as e:
        text = str(e)
        if len(text) > MAX_ERROR_CHARS:  # a value echoed whole (a 10 MB entry) stays readable
            text = f"{text[: MAX_ERROR_CHARS - 40]}... ({len(text)} characters, cut)"
        print(f"{prog}: {'error: ' if e.exit_code == 2 else ''}{text}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        fix = os_error_fix(e)
        if fix is None:  # not the machine's answer to the user's paths: a bug, with its traceback
            raise
        where = f" {e.filename!r}" if e.filename else ""
        print(
            f"{prog}: error: cannot use{where[:300]}: {e.strerror or e}; {fix} (a finished run "
            "there is untouched; a rerun resumes or starts over)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - only TensorFlow's file errors are answered here
        # TensorFlow's own file writers (TFRecord shards, TensorBoard, checkpoints) report a full
        # or read-only disk as an OpError, not an OSError.
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        full = "No space left on device" in text or "Read-only file system" in text
        if not (type(e).__module__.startswith("tensorflow") and full):
            raise
        print(
            f"{prog}: error: cannot write {text[:300]}; free space there or give another -o / "
            "--data-dir (a finished run there is untouched; a rerun resumes or starts over)",
            file=sys.stderr,
        )
        return 2
