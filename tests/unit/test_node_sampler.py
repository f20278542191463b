"""The sampler's GPU readings, parsed from what NVML and ``nvidia-smi`` really answer."""

from __future__ import annotations

from sshddp.remote import node_sampler

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
