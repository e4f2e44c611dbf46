"""``rlzoo export RUN_DIR OUT``: a run's trained policy as one model directory.

A full fine-tuning run's checkpoint already holds the policy as a model directory; a LoRA
run's holds only the adapters, which are merged into the base weights of the run's
``init_model/`` (``W + (alpha / r)·B·A``, :func:`rlzoo.models.lora.merged_policy`). Either way
``OUT`` is a plain transformers model directory with the tokenizer, which
``model.path=OUT`` (or any transformers code) loads without peft.
"""

from __future__ import annotations

from pathlib import Path

from rlzoo.run.checkpoint import checkpoint_name, list_checkpoints, newest_intact_checkpoint, verify_checkpoint
from rlzoo.config.yamlfile import read_yaml
from rlzoo.core.errors import ConfigError
from rlzoo.models.lora import ADAPTER_CONFIG, merged_policy
from rlzoo.models.build import load_pretrained
from rlzoo.run.rundir import CONFIG_FILE, INIT_MODEL_DIR, check_new_output_dir


def export_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The checkpoint to export: that of ``step``, or the newest intact one.

    :raises ConfigError: a negative step, no such checkpoint, or it fails verification
        against its manifest.
    """
    if step is not None and step < 0:
        raise ConfigError(f"--step must be a checkpoint's step (>= 0), got {step}; the steps of {run_dir}: "
                          f"{', '.join(str(s) for s, _ in list_checkpoints(run_dir)) or 'none'}")
    if step is None:
        checkpoint, damaged = newest_intact_checkpoint(run_dir)
        if checkpoint is None:
            why = f" ({damaged[0][0].name}: {damaged[0][1]})" if damaged else ""
            raise ConfigError(f"{run_dir} has no intact checkpoint to export{why}")
        return checkpoint
    found = dict(list_checkpoints(run_dir))
    if step not in found:
        raise ConfigError(f"{run_dir} has no checkpoint {checkpoint_name(step)}; it has "
                          f"{', '.join(str(s) for s in sorted(found)) or 'none'}")
    reason = verify_checkpoint(found[step])
    if reason is not None:
        raise ConfigError(f"checkpoint {found[step]} is damaged ({reason}); export another --step")
    return found[step]


def export_policy(run_dir: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Write the policy of ``run_dir``'s checkpoint (``step``, else the newest intact one)
    to ``out`` as a model directory (weights in the run's ``model.dtype``, plus tokenizer);
    LoRA adapters are merged into the base weights. Returns the checkpoint exported.

    :raises ConfigError: ``run_dir`` is not a run, has no such checkpoint, or ``out``
        exists and is not an empty directory.
    """
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no {CONFIG_FILE})")
    check_new_output_dir(out, "OUT")
    checkpoint = export_checkpoint(run_dir, step)
    dtype = str(read_yaml(run_dir / CONFIG_FILE, "run config").get("model", {}).get("dtype", "float32"))
    policy_dir = checkpoint / "policy"
    if (policy_dir / ADAPTER_CONFIG).is_file():
        base, tokenizer = load_pretrained(run_dir / INIT_MODEL_DIR, dtype)
        model = merged_policy(base, policy_dir)
    else:
        model, tokenizer = load_pretrained(policy_dir, dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return checkpoint
