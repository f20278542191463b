"""The sampler's GPU readings, parsed from what NVML and ``nvidia-smi`` really answer."""

from __future__ import annotations

from sshddp.remote.calls import node_sampler

#: ``nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw,
#: temperature.gpu --format=csv,noheader,nounits`` on an 8-GPU node (two GPUs shown), one
#: of them a MIG-enabled GPU that reports no utilisation
SMI = (
    "0, NVIDIA H200, 97, 120543, 143771, 612.35, 61\n"
    "1, NVIDIA A100-SXM4-80GB, [N/A], 13, 81920, [Not Supported], 33\n"
)


def test_nvidia_smi_csv_is_parsed_with_unknowns_as_none() -> None:
    gpus = node_sampler.smi_samples(SMI)
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "util": 97.0,
        "mem_used": 120543 << 20,
        "mem_total": 143771 << 20,
        "power": 612.35,
        "temp": 61.0,
    }
    assert gpus[1]["util"] is None and gpus[1]["power"] is None
    assert gpus[1]["mem_used"] == 13 << 20 and gpus[1]["name"] == "NVIDIA A100-SXM4-80GB"


def test_nvidia_smi_noise_is_no_gpu() -> None:
    text = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    assert node_sampler.smi_samples(text) == []
    assert node_sampler.smi_samples("") == []


def test_nvml_answers_make_a_gpu_record() -> None:
    # nvmlUtilization_t {gpu, memory}, nvmlMemory_t {total, free, used}, power in mW
    gpu = node_sampler.nvml_sample(
        3, b"NVIDIA H200", (88, 41), (150754820096, 24696061952, 126058758144), 455123, 57
    )
    assert gpu == {
        "index": 3,
        "name": "NVIDIA H200",
        "util": 88.0,
        "mem_used": 126058758144,
        "mem_total": 150754820096,
        "power": 455.1,
        "temp": 57.0,
    }
    unknown = node_sampler.nvml_sample(0, b"", None, None, None, None)
    assert unknown["util"] is None and unknown["mem_used"] is None and unknown["power"] is None


def _sample(*gpus: tuple[float, int]) -> dict:
    return {
        "gpus": [
            {"index": i, "util": u, "mem_used": m, "mem_total": 80 << 30}
            for i, (u, m) in enumerate(gpus)
        ]
    }


def test_a_nodes_usage_is_its_gpus_mean_and_the_fullest_gpu() -> None:
    samples = [_sample((90.0, 10 << 30), (70.0, 30 << 30)), _sample((80.0, 40 << 30), (0.0, 1))]
    assert node_sampler.usage_of(samples) == {  # type: ignore[arg-type]
        "samples": 2,
        "waits": {},
        "gpus": 2,
        "gpu_util": 60.0,
        "gpu_mem_peak": 40 << 30,
        "gpu_mem_total": 80 << 30,
    }


def test_a_node_without_gpus_has_a_usage_of_nulls() -> None:
    usage = node_sampler.usage_of([{"gpus": []}, {"gpus": []}])  # type: ignore[list-item]
    assert usage == {
        "samples": 2,
        "waits": {},
        "gpus": 0,
        "gpu_util": None,
        "gpu_mem_peak": None,
        "gpu_mem_total": None,
    }


def test_usage_reads_both_kept_files_and_skips_a_broken_line(tmp_path) -> None:
    import json

    (tmp_path / "samples.1.jsonl").write_text(json.dumps(_sample((10.0, 5))) + "\n")
    good = json.dumps(_sample((30.0, 7)))
    (tmp_path / "samples.jsonl").write_text(good + "\n" + good[:20] + "\n")
    usage = node_sampler.usage(str(tmp_path))
    assert usage["samples"] == 2 and usage["gpu_util"] == 20.0 and usage["gpu_mem_peak"] == 7
