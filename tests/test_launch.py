"""Multi-node launch files: the SLURM script run under a stand-in SLURM on one machine (two
"nodes", one process each, meeting over localhost), and the Kubernetes Job's structure."""

import json
import os
import shlex
import socket
import subprocess

import pytest
import yaml
from conftest import ACCELERATE, NO_EVAL, PYTHON, ROOT

# srun on one machine: each task a background process with its own SLURM_PROCID.
FAKE_SRUN = """#!/bin/bash
ntasks=1
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in --ntasks=*) ntasks=${1#--ntasks=} ;; esac
    shift
done
pids=()
for ((i = 0; i < ntasks; i++)); do SLURM_PROCID=$i SLURM_NODEID=$i "$@" & pids+=($!); done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
FAKE_SCONTROL = """#!/bin/bash
case $1 in
    show) printf '127.0.0.1\\n127.0.0.1\\n' ;;
    requeue) echo "$2" >> "$(dirname "$0")/requeued" ;;
esac
"""
# DDP over gloo: what accelerate_configs/ddp.yaml is on GPUs.
CPU_DDP = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: 'no'
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
use_cpu: false
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.long  # four processes on two simulated nodes
def test_slurm_script_trains_on_two_nodes_with_the_recipe_accumulation(tiny_model, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in [("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)]:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "ddp.yaml").write_text(CPU_DDP)
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT / "src"),
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_JOB_ID": "42",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "GPUS_PER_NODE": "1",
        "MAIN_PORT": str(free_port()),
        "MEDRECIPES": f"{PYTHON} -m medrecipes.cli",
        "ACCELERATE": str(ACCELERATE),
    }
    recipe_args = ["recipes/tiny_cpt.yaml", "--model_name_or_path", tiny_model, "--output_dir", out]
    budget = ["--global_batch_tokens", "4096", "--total_tokens", "8192", *NO_EVAL]
    result = subprocess.run(
        ["bash", ROOT / "recipes" / "launch" / "slurm.sbatch", "recipes/cpt.py", recipe_args[0], tmp_path / "ddp.yaml"]
        + [str(a) for a in recipe_args[1:] + budget + ["--load_best_model_at_end", "false"]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    # 8 sequences x 128 tokens x 2 nodes = 2048 tokens per micro-step: the recipe's 4096 needs 2.
    assert "GRADIENT_ACCUMULATION_STEPS=2" in result.stdout
    for rank in (0, 1):
        line = next(x for x in result.stdout.splitlines() if x.startswith(f"node {rank} of 2:"))
        launch = shlex.split(line.split(":", 1)[1])
        flags = dict(zip(launch[2::2], launch[3::2], strict=False))
        assert flags["--machine_rank"] == str(rank) and flags["--num_machines"] == "2"
        assert flags["--num_processes"] == "2" and flags["--gradient_accumulation_steps"] == "2"
        assert flags["--main_process_ip"] == "127.0.0.1"
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["num_input_tokens_seen"] == 8192
    assert (out / "final" / "model.safetensors").is_file()
    assert not (bin_dir / "requeued").exists()


def test_kubernetes_job_runs_one_node_per_pod_with_gpus_and_a_shared_volume():
    service, job = yaml.safe_load_all((ROOT / "recipes" / "launch" / "k8s-job.yaml").read_text())
    spec = job["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == int(env["NNODES"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == int(env["GPUS_PER_NODE"])
    # Pod 0 answers at <job>-0.<subdomain>, which the headless Service makes resolvable.
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    assert env["MAIN_ADDR"] == f"{job['metadata']['name']}-0.{pod['subdomain']}"
    script = container["args"][0]
    assert "NODE_RANK=$JOB_COMPLETION_INDEX exec bash recipes/launch/node.sh" in script
    words = shlex.split(script)
    assert (ROOT / words[4]).is_file() and (ROOT / words[5]).is_file() and (ROOT / words[6]).is_file()
    output_dir = words[words.index("--output_dir") + 1]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert output_dir.startswith(mounts["checkpoints"] + "/")
    claim = next(v for v in pod["volumes"] if v["name"] == "checkpoints")["persistentVolumeClaim"]
    assert claim["claimName"]
    assert pod["terminationGracePeriodSeconds"] > 120  # the recipes' default preemption_grace_seconds
    assert container["env"][-1]["valueFrom"]["secretKeyRef"]  # the Hub token from a secret, not the file
    subprocess.run(["bash", "-n", ROOT / "recipes" / "launch" / "node.sh"], check=True)
    subprocess.run(["bash", "-n", ROOT / "recipes" / "launch" / "slurm.sbatch"], check=True)


@pytest.mark.slow
@pytest.mark.long  # two launches of two processes
def test_a_launch_that_accelerate_sets_up_otherwise_is_said(tiny_model, tmp_path):
    """Two processes that accelerate sets up each alone (a CPU launch without use_cpu) would train
    the run twice into one folder: one line, exit 2, nothing written. An FSDP config on CPU
    processes trains as plain data parallel: said in one line, and the run goes on."""
    from conftest import LAUNCH, error_lines

    args = ["recipes/tiny_cpt.yaml", "--model_name_or_path", tiny_model, "--max_steps", "1", *NO_EVAL,
            "--save_strategy", "no"]  # fmt: skip
    alone = subprocess.run(
        [*LAUNCH, "--config_file", "accelerate_configs/ddp.yaml", "--mixed_precision", "no", "--num_processes", "2",
         "recipes/cpt.py", *args, "--use_cpu", "false", "--output_dir", str(tmp_path / "alone")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert alone.returncode != 0
    assert error_lines(alone.stderr) == [
        "error: launch: 2 processes were started but accelerate set each up alone (NO on cpu), so each would train "
        "this whole run into the same output_dir; set use_cpu: true in the recipe for CPU processes, or launch one process"
    ], alone.stderr[-3000:]
    assert not (tmp_path / "alone").exists()
    fsdp = subprocess.run(
        [*LAUNCH, "--config_file", "accelerate_configs/fsdp.yaml", "--mixed_precision", "no", "--num_processes", "2",
         "recipes/cpt.py", *args, "--output_dir", str(tmp_path / "fsdp")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    said = [
        line
        for line in (fsdp.stdout + fsdp.stderr).splitlines()
        if "ACCELERATE_USE_FSDP=true (an accelerate config's FSDP" in line
    ]
    assert len(said) == 1 and "set up MULTI_CPU on cpu" in said[0], said  # once a launch


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "accelerate_configs").glob("*.yaml")))
def test_each_shipped_accelerate_config_validates_with_its_processes(config, capsys):
    """`medrecipes validate --accelerate-config` (what `make sft CONFIG=...` runs before the launch)
    reads each shipped config as accelerate does and derives the recipe's settings for its process
    count: a token-budget recipe's accumulation on 8 processes is an eighth of one process's."""
    import yaml

    from medrecipes.cli import main

    processes = yaml.safe_load((ROOT / "accelerate_configs" / config).read_text())["num_processes"]
    main(["validate", "recipes/pure_transformer_0p4b.yaml"])
    alone = yaml.safe_load(capsys.readouterr().out)["gradient_accumulation_steps"]
    main(["validate", "recipes/pure_transformer_0p4b.yaml", "--accelerate-config", f"accelerate_configs/{config}"])
    out = capsys.readouterr().out
    assert f"# launch: accelerate_configs/{config}: {processes} processes a machine" in out
    assert yaml.safe_load(out)["gradient_accumulation_steps"] * processes == alone
    assert f"# derived: gradient_accumulation_steps = {alone // processes}" in out


def test_validate_reads_the_recipe_with_the_launchers_precision(tmp_path, capsys):
    """As `accelerate launch` hands its mixed_precision to the recipe: a recipe that leaves its
    precision out takes the config's, one that sets another is refused in the launch's own line
    (exit 2)."""
    import yaml

    from medrecipes.cli import main

    main(["validate", "recipes/tiny_cpt.yaml", "--accelerate-config", "accelerate_configs/zero3.yaml"])
    out = capsys.readouterr().out
    assert "valid cpt recipe" in out  # the recipe leaves bf16 to zero3.yaml's
    assert yaml.safe_load(out)["bf16"] is True  # and shows the precision the launch trains in
    config = yaml.safe_load((ROOT / "accelerate_configs" / "ddp.yaml").read_text()) | {"mixed_precision": "fp16"}
    (tmp_path / "fp16.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit:
        main(
            [
                "validate",
                "recipes/tiny_cpt.yaml",
                "--bf16",
                "false",
                "--accelerate-config",
                str(tmp_path / "fp16.yaml"),
            ]
        )
    assert exit.value.code == 2
    assert "accelerate launch runs with mixed_precision fp16 but the recipe with no" in capsys.readouterr().err


@pytest.mark.parametrize("bf16_here", [False, True])
def test_validate_says_a_bf16_launch_this_machine_cannot_train(bf16_here, capsys, monkeypatch):
    """A GPU recipe validated with a bf16 config on a machine without a GPU that has bf16 (a login
    node): valid, with the line that a launch here stops at its start (transformers refuses bf16
    there). A CPU recipe, or a machine with such a GPU, is not told."""
    from medrecipes.cli import main
    from medrecipes.plan import launch

    monkeypatch.setattr(launch, "_bf16_here", lambda: bf16_here)
    for recipe, said in (("recipes/gemma3_4b.yaml", not bf16_here), ("recipes/tiny_cpt.yaml", False)):
        main(["validate", recipe, "--accelerate-config", "accelerate_configs/zero2.yaml"])
        out, err = capsys.readouterr()
        assert "valid" in out
        line = "the launch trains in bf16 (accelerate_configs/zero2.yaml: mixed_precision bf16), which transformers"
        assert (line in err) is said, err


@pytest.mark.parametrize(
    "recipe, setting, config, launched",
    [
        ("tiny_grpo", "--ds3_gather_for_generation", "zero3.yaml", True),  # read under ZeRO-3
        ("tiny_grpo", "--ds3_gather_for_generation", "zero2.yaml", False),
        ("tiny_sft", "--ddp_find_unused_parameters", "ddp.yaml", True),  # read by several processes
    ],
)
def test_validate_notes_what_the_launch_will_read(recipe, setting, config, launched, capsys):
    """A setting for several processes or for a sharding is noted as doing nothing in a process alone,
    and not where `--accelerate-config` names the launch that reads it."""
    from medrecipes.cli import main

    argv = ["validate", f"recipes/{recipe}.yaml", setting, "false", "--per_device_train_batch_size", "2"]
    main(argv)
    assert setting[2:] in "".join(line for line in capsys.readouterr().out.splitlines() if "# note:" in line)
    main([*argv, "--accelerate-config", f"accelerate_configs/{config}"])
    notes = "".join(line for line in capsys.readouterr().out.splitlines() if "# note:" in line)
    assert (setting[2:] not in notes) == launched


def test_the_offload_devices_named_are_deepspeeds():
    """The names `validate --accelerate-config` takes for DeepSpeed's offload devices are those of
    the installed DeepSpeed (kept out of the read-only commands' process, so written down)."""
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    from medrecipes.plan.launch import OFFLOAD_DEVICES

    assert OFFLOAD_DEVICES == tuple(device.value for device in OffloadDeviceEnum)


@pytest.mark.parametrize(
    "config, said",
    [
        ("distributed_type: 'NO'\nnum_processes: 4\n", "distributed_type NO starts one process, not 4"),
        ("distributed_type: NO\nnum_processes: 4\n", "distributed_type NO starts one process, not 4"),  # false to YAML
        ("distributed_type: MULTI_CPU\nnum_processes: 2\n", "distributed_type MULTI_CPU starts one process, not 2"),
        ("distributed_type: MULTI_GPU\nnum_processes: 2\nuse_cpu: true\n", "use_cpu: true starts one process, not 2"),
        ("distributed_type: MULTI_CPU\nnum_processes: 2\nmpirun_config:\n  mpirun_hostfile: hosts\n", None),
        ("distributed_type: MULTI_CPU\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n",
         "fsdp_config does nothing while distributed_type is MULTI_CPU, not FSDP"),
        ("distributed_type: MULTI_GPU\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 2\n",
         "deepspeed_config does nothing while distributed_type is MULTI_GPU, not DEEPSPEED"),
        ("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 2\n  offload_param_device: cpu\n",
         "offload_param_device cpu does nothing at zero_stage 2"),
        ("distributed_type: 'NO'\nnum_processes: 1\ndowncast_bf16: 'no'\n", None),  # as `accelerate config` writes it
    ],
)  # fmt: skip
def test_what_an_accelerate_config_sets_that_its_launch_does_not_use_is_said(tmp_path, capsys, config, said):
    from medrecipes.cli import main

    path = tmp_path / "launch.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\nmixed_precision: 'no'\n" + config)
    main(["validate", "recipes/tiny_cpt.yaml", "--accelerate-config", str(path)])
    launch = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("# launch:"))
    assert (said in launch) if said else launch.endswith(("1 process a machine", "2 processes a machine")), launch


def test_a_launch_of_more_cpu_processes_than_cores_is_said(capsys, tmp_path, monkeypatch):
    """Processes that train on the CPU share its cores: more of them than there are cores is said,
    as many is not (the count read where the launch runs: the cores this process may use)."""
    import os

    import torch
    import yaml

    from medrecipes.cli import main

    cores = len(os.sched_getaffinity(0))
    for processes, said in ((cores, False), (cores + 1, True)):
        config = yaml.safe_load((ROOT / "accelerate_configs" / "ddp.yaml").read_text()) | {"num_processes": processes}
        (tmp_path / "cpus.yaml").write_text(yaml.safe_dump(config))
        main(["validate", "recipes/tiny_sft.yaml", "--accelerate-config", str(tmp_path / "cpus.yaml")])
        out, err = capsys.readouterr()
        notes = [line for line in out.splitlines() if line.startswith("# note:")]
        assert any(f"processes train on the CPU and share this machine's {cores} cores" in n for n in notes) == said
        warned = [line for line in err.splitlines() if line.startswith("warning:")]  # seen when stdout is piped
        assert [n.removeprefix("# note:") for n in notes] == [w.removeprefix("warning:") for w in warned]
    # A config whose launch starts one process whatever num_processes says (distributed_type NO on a
    # machine without several GPUs): its processes are not counted against the cores.
    if not torch.cuda.device_count() > 1:
        (tmp_path / "no.yaml").write_text(yaml.safe_dump(config | {"distributed_type": "NO"}))
        main(["validate", "recipes/tiny_sft.yaml", "--accelerate-config", str(tmp_path / "no.yaml")])
        out = capsys.readouterr().out
        assert "distributed_type NO starts one process" in out and "cores" not in out, out
