"""A small stand-in for a TAO container's training entry point (standard library only, Python 3.11).

``make demo`` copies it to ``/srv/lustre/demo/tao_like_train.py`` on the local test cluster, where
the example DAGs run it inside a GPU job::

    python3 tao_like_train.py --spec SPEC --results RESULTS_DIR [--epoch-seconds S]
                              [--fail-at-epoch N] [--exit-code C]
    python3 tao_like_train.py --action evaluate|export --checkpoint CHECKPOINTS_DIR --results RESULTS_DIR

It behaves like a TAO ``train`` action, only tiny:

- reads the spec (JSON, or the block-style YAML subset ``yaml.safe_dump`` writes) with a ``train``
  section (``epochs``, ``batch_size``, ``learning_rate``; optional ``fail_at_epoch`` and
  ``fail_exit_code``) and a ``dataset`` section of dataset paths, which must exist;
- needs a GPU: fails when ``CUDA_VISIBLE_DEVICES`` is not set, and prints it;
- prints progress to stdout, writes ``<results>/checkpoints/epoch_N.ckpt`` after every epoch and
  resumes after the last checkpoint when run again (a requeued job);
- appends TAO status lines (JSON lines with ``date``, ``time``, ``status``, ``verbosity``,
  ``message`` and ``epoch``) to ``<results>/status.json``: STARTED, RUNNING per epoch, then
  SUCCESS, or FAILURE with a non-zero exit code;
- says which secret-looking environment variables are set and how long they are, never their values.

``--action evaluate`` and ``--action export`` stand in for TAO's next actions in a pipeline: they
read the newest checkpoint of an earlier training (``--checkpoint``, its ``checkpoints`` directory),
then write ``<results>/evaluation.json`` (KPIs) or ``<results>/export/model.onnx`` (a text stand-in
naming the checkpoint), with the same status lines. As TAO's evaluate does, the evaluation's KPIs
(``accuracy``, ``1 - loss/4`` of the checkpoint, and ``loss``) also go into its status lines' ``kpi``
mapping, from the line that reports them on (TAO's status logger repeats them on every later line).

Failing on purpose (for tests): ``--fail-at-epoch N`` (or ``train.fail_at_epoch``) stops at epoch
N with exit code ``--exit-code`` (or ``train.fail_exit_code``, default 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE)
CHECKPOINT = re.compile(r"^epoch_(\d+)\.ckpt$")
MAPPING_ITEM = re.compile(r"^[^'\"\s][^:]*:(\s|$)")


class SpecError(Exception):
    """The spec cannot be read or lacks a required value."""


def parse_scalar(text: str) -> Any:
    """One YAML scalar of the subset ``yaml.safe_dump`` writes: quoted or plain strings, numbers, bools, null."""
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        return text[1:-1].replace("''", "'")
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return json.loads(text)
    if text in ("null", "~", ""):
        return None
    if text in ("true", "false"):
        return text == "true"
    if text in ("{}", "[]"):
        return {} if text == "{}" else []
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def parse_yaml_subset(text: str) -> Any:
    """Parse block-style YAML: nested mappings and ``- item`` lists of scalars or mappings.

    :raises SpecError: on anything outside that subset (flow collections, multi-line strings).
    """
    lines = [
        (len(line) - len(line.lstrip(" ")), line.strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#") and line.strip() != "---"
    ]

    def block(start: int, indent: int) -> tuple[Any, int]:
        if lines[start][1].startswith("- ") or lines[start][1] == "-":
            items: list[Any] = []
            index = start
            while index < len(lines) and lines[index][0] == indent and lines[index][1].startswith("-"):
                rest = lines[index][1][1:].strip()
                if not rest:
                    value, index = block(index + 1, lines[index + 1][0])
                elif MAPPING_ITEM.match(rest):
                    # "- key: value" opens a mapping whose other keys sit two columns further in.
                    lines[index] = (indent + 2, rest)
                    value, index = block(index, indent + 2)
                else:
                    value, index = parse_scalar(rest), index + 1
                items.append(value)
            return items, index
        mapping: dict[str, Any] = {}
        index = start
        while index < len(lines) and lines[index][0] == indent:
            key, sep, rest = lines[index][1].partition(":")
            if not sep or key.startswith("-"):
                raise SpecError(f"spec line {lines[index][1]!r} is not 'key: value'")
            key = str(parse_scalar(key.strip()))
            rest = rest.strip()
            if rest:
                mapping[key], index = parse_scalar(rest), index + 1
            elif index + 1 < len(lines) and (
                lines[index + 1][0] > indent or (lines[index + 1][0] == indent and lines[index + 1][1].startswith("-"))
            ):
                # A nested block: deeper lines, or a list at the key's own indentation (safe_dump's style).
                mapping[key], index = block(index + 1, lines[index + 1][0])
            else:
                mapping[key], index = None, index + 1
        return mapping, index

    if not lines:
        return {}
    value, used = block(0, lines[0][0])
    if used != len(lines):
        raise SpecError(f"spec line {lines[used][1]!r} has an unexpected indentation")
    return value


def load_spec(path: Path) -> dict[str, Any]:
    """Read the spec: JSON first, then the YAML subset.

    :raises SpecError: when the file is missing or not a mapping.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read spec {path}: {exc.strerror}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        spec = parse_yaml_subset(text)
    if not isinstance(spec, dict):
        raise SpecError(f"spec {path} is not a mapping")
    return spec


class StatusWriter:
    """Appends TAO-style status lines to ``status.json`` and echoes them to stdout.

    Once :attr:`kpi` is set, every line carries it under ``"kpi"``, as TAO's status logger does.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kpi: dict[str, Any] = {}

    def write(self, status: str, message: str, *, epoch: int | None = None, verbosity: str = "INFO") -> None:
        """Append one JSON line (flushed at once, so a watcher sees it while the job runs)."""
        now = datetime.now()
        entry: dict[str, Any] = {
            "date": f"{now.month}/{now.day}/{now.year}",
            "time": now.strftime("%H:%M:%S"),
            "status": status,
            "verbosity": verbosity,
            "message": message,
        }
        if epoch is not None:
            entry["epoch"] = epoch
        if self.kpi:
            entry["kpi"] = self.kpi
        with self.path.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")
        print(f"[status] {status}: {message}", flush=True)


def last_checkpoint(directory: Path) -> int:
    """The highest epoch with a checkpoint in ``directory`` (0 when none)."""
    epochs = [int(m.group(1)) for p in directory.glob("epoch_*.ckpt") if (m := CHECKPOINT.match(p.name))]
    return max(epochs, default=0)


def setting(section: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """A typed value of the spec's ``train`` section.

    :raises SpecError: when it is missing (and has no default) or has the wrong type.
    """
    value = section.get(key, default)
    if value is None:
        raise SpecError(f"spec train.{key} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
        raise SpecError(f"spec train.{key} must be a {kind.__name__}, got {value!r}")
    return kind(value)


def report_environment() -> str:
    """Print the GPU and secret-variable facts a job log should show; return CUDA_VISIBLE_DEVICES.

    :raises SpecError: when no GPU was allocated.
    """
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if not gpus:
        raise SpecError("CUDA_VISIBLE_DEVICES is not set: this program needs a GPU (ask for --gres=gpu:N)")
    print(f"CUDA_VISIBLE_DEVICES={gpus}", flush=True)
    for name in sorted(os.environ):
        if SECRET_NAME.search(name):
            print(f"{name} is set ({len(os.environ[name])} chars)", flush=True)
    return gpus


def train(args: argparse.Namespace, status: StatusWriter) -> int:
    """Run the epochs; return the exit code."""
    spec = load_spec(args.spec)
    section = spec.get("train", spec)
    if not isinstance(section, dict):
        raise SpecError("spec train must be a mapping")
    epochs = setting(section, "epochs", int)
    batch_size = setting(section, "batch_size", int, 1)
    learning_rate = setting(section, "learning_rate", float, 0.001)
    fail_at = args.fail_at_epoch or section.get("fail_at_epoch")
    exit_code = args.exit_code if args.exit_code is not None else int(section.get("fail_exit_code", 1))
    datasets = spec.get("dataset") or {}
    paths = list(datasets.values()) if isinstance(datasets, dict) else list(datasets)
    missing = [str(p) for p in paths if not Path(str(p)).exists()]
    if missing:
        raise SpecError(f"dataset paths do not exist: {', '.join(missing)}")
    gpus = report_environment()

    checkpoints = args.results / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    done = last_checkpoint(checkpoints)
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    status.write(
        "STARTED",
        f"training {epochs} epochs, batch size {batch_size}, learning rate {learning_rate}, "
        f"{len(paths)} dataset path(s), GPUs {gpus}"
        + (f", resuming after epoch {done}" if done else "")
        + (f", restart {restart}" if restart != "0" else ""),
    )
    for path in paths:
        entries = sorted(p.name for p in Path(str(path)).iterdir()) if Path(str(path)).is_dir() else [Path(path).name]
        print(f"dataset {path}: {len(entries)} entries", flush=True)
    for epoch in range(done + 1, epochs + 1):
        time.sleep(args.epoch_seconds)
        if fail_at is not None and epoch == int(fail_at):
            status.write("FAILURE", f"failing on purpose at epoch {epoch} (exit code {exit_code})", epoch=epoch)
            print(f"Error: injected failure at epoch {epoch}", file=sys.stderr, flush=True)
            return exit_code
        loss = round(2.0 * math.exp(-learning_rate * 100 * epoch) + 0.05, 6)
        (checkpoints / f"epoch_{epoch}.ckpt").write_text(
            json.dumps({"epoch": epoch, "loss": loss, "learning_rate": learning_rate, "batch_size": batch_size}) + "\n"
        )
        print(f"Epoch {epoch}/{epochs}: loss={loss} lr={learning_rate}", flush=True)
        status.write("RUNNING", f"epoch {epoch}/{epochs} done, loss {loss}", epoch=epoch)
    status.write("SUCCESS", f"training finished: {epochs} epochs, checkpoints in {checkpoints}", epoch=epochs)
    return 0


def newest_checkpoint(directory: Path | None) -> tuple[Path, dict[str, Any]]:
    """The newest ``epoch_N.ckpt`` of an earlier training and its content.

    :raises SpecError: when ``--checkpoint`` is missing or holds no checkpoint.
    """
    if directory is None:
        raise SpecError("--checkpoint is required: the checkpoints directory of the training job")
    epoch = last_checkpoint(directory) if directory.is_dir() else 0
    if not epoch:
        raise SpecError(f"no checkpoint in {directory}: run the training first")
    path = directory / f"epoch_{epoch}.ckpt"
    return path, json.loads(path.read_text())


def evaluate(args: argparse.Namespace, status: StatusWriter) -> int:
    """Evaluate the newest checkpoint: KPIs into ``evaluation.json`` and the status lines; return the exit code."""
    report_environment()
    path, checkpoint = newest_checkpoint(args.checkpoint)
    status.write("STARTED", f"evaluating {path}")
    accuracy = round(1 - checkpoint["loss"] / 4, 6)
    kpis = {"checkpoint": str(path), "epoch": checkpoint["epoch"], "accuracy": accuracy}
    (args.results / "evaluation.json").write_text(json.dumps(kpis) + "\n")
    status.kpi = {"accuracy": accuracy, "loss": checkpoint["loss"]}
    status.write("RUNNING", "evaluation metrics computed", epoch=checkpoint["epoch"])
    status.write("SUCCESS", f"evaluation finished: accuracy {accuracy} at epoch {kpis['epoch']}")
    return 0


def export(args: argparse.Namespace, status: StatusWriter) -> int:
    """Export the newest checkpoint to ``export/model.onnx`` (a stand-in); return the exit code."""
    report_environment()
    path, checkpoint = newest_checkpoint(args.checkpoint)
    status.write("STARTED", f"exporting {path}")
    target = args.results / "export" / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"format": "onnx stand-in", "checkpoint": str(path), "epoch": checkpoint["epoch"]}))
    status.write("SUCCESS", f"exported {path} to {target}")
    return 0


ACTIONS = {"train": train, "evaluate": evaluate, "export": export}


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the action, and return the exit code."""
    parser = argparse.ArgumentParser(description="TAO-like training stand-in")
    parser.add_argument("--action", choices=sorted(ACTIONS), default="train", help="what to run (default train)")
    parser.add_argument("--spec", type=Path, help="spec file (JSON or simple YAML); required by train")
    parser.add_argument("--checkpoint", type=Path, help="checkpoints directory of the training (evaluate, export)")
    parser.add_argument("--results", type=Path, required=True, help="results directory")
    parser.add_argument("--epoch-seconds", type=float, default=1.0, help="seconds each epoch takes")
    parser.add_argument("--fail-at-epoch", type=int, default=None, help="fail on purpose at this epoch")
    parser.add_argument("--exit-code", type=int, default=None, help="exit code of the purposeful failure")
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    status = StatusWriter(args.results / "status.json")
    print(f"tao_like_train: {args.action}, spec {args.spec}, results {args.results}", flush=True)
    try:
        if args.action == "train" and args.spec is None:
            raise SpecError("--spec is required for train")
        return ACTIONS[args.action](args, status)
    except (SpecError, OSError, ValueError) as exc:
        status.write("FAILURE", str(exc), verbosity="ERROR")
        print(f"Error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
