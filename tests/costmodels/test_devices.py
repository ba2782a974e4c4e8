"""Device presets of this generation (Blackwell, Blackwell Ultra, MI300X) and the FP8 peaks; the
figures themselves are cited in costmodels/hardware.py and costmodels/topology.py."""

import pytest

from costmodels.comm import GroupShape, allreduce_s, ring_allreduce_s
from costmodels.hardware import DEVICES
from costmodels.topology import CLUSTERS, cluster_from_mapping, get_cluster

NEW = ("b200", "gb200", "b300", "gb300", "mi300x")
FP8_NVIDIA = ("h100", "h200", "l4", "rtx4090", "b200", "gb200", "b300", "gb300")
HOPPER_BLACKWELL = ("h100", "h200", "b200", "gb200", "b300", "gb300")


@pytest.mark.parametrize("name", NEW)
def test_new_devices_have_every_figure(name):
    d = DEVICES[name]
    for dtype in ("bf16", "fp16", "fp32", "fp8"):
        assert d.peak(dtype) > 0
    assert d.memory_bytes > 0 and d.hbm_bytes_per_s > 0
    assert d.sm_count > 1 and d.host_link_bytes_per_s > 0 and d.host_memory_bytes_per_s > 0
    assert d.description


@pytest.mark.parametrize("name", FP8_NVIDIA + ("mi300x",))
def test_fp8_is_at_least_bf16(name):
    d = DEVICES[name]
    assert d.peak("fp8") >= d.peak("bf16")


@pytest.mark.parametrize("name", HOPPER_BLACKWELL + ("mi300x",))
def test_fp8_is_twice_bf16_on_hopper_blackwell_and_cdna3(name):
    d = DEVICES[name]
    assert d.peak("fp8") == pytest.approx(2 * d.peak("bf16"), rel=1e-3)


def test_devices_without_fp8_tensor_cores_have_no_fp8_peak():
    for name in ("a100-40g", "a100-80g", "v100", "cpu"):
        assert "fp8" not in DEVICES[name].peak_flops


def test_data_sheet_figures():
    b200, gb200, b300, gb300, mi = (DEVICES[n] for n in NEW)
    assert (b200.peak("bf16"), b200.peak("fp8"), b200.memory_bytes) == (2250e12, 4500e12,
                                                                         183_359 * 2 ** 20)
    assert (gb200.peak("bf16"), gb200.peak("fp8"), gb200.memory_bytes) == (2500e12, 5000e12, 186e9)
    assert (b300.memory_bytes, gb300.memory_bytes) == (288e9, 288e9)
    assert all(d.hbm_bytes_per_s == 8000e9 for d in (b200, gb200, b300, gb300))
    assert (mi.peak("bf16"), mi.peak("fp8"), mi.memory_bytes, mi.hbm_bytes_per_s, mi.sm_count) == (
        1307.4e12, 2614.9e12, 192e9, 5300e9, 304)
    assert DEVICES["h100"].peak("fp8") == 1979e12
    # Grace-hosted GPUs reach the host over NVLink-C2C (450 GB/s one way), not PCIe
    assert gb200.host_link_bytes_per_s == gb300.host_link_bytes_per_s == 450e9
    assert gb200.host_link_bytes_per_s > b200.host_link_bytes_per_s


def test_new_presets_exist_with_their_devices():
    expect = {"dgx-b200": ("b200", 8), "dgx-b300": ("b300", 8), "gb200-nvl72": ("gb200", 72),
              "gb300-nvl72": ("gb300", 72), "mi300x-8": ("mi300x", 8)}
    for name, (device, gpn) in expect.items():
        c = CLUSTERS[name]
        assert (c.device.name, c.gpus_per_node) == (device, gpn)
        assert c.intra_node.effective_bytes_per_s > c.inter_node.effective_bytes_per_s > 0
    assert CLUSTERS["dgx-b200"].intra_node.bandwidth_bytes_per_s == 900e9  # 1.8 TB/s bidir.
    assert CLUSTERS["mi300x-8"].intra_node.bandwidth_bytes_per_s == 7 * 64e9  # 7-link mesh


@pytest.mark.parametrize("name", ("dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72", "mi300x-8"))
def test_new_presets_round_trip_through_their_yaml_form(name):
    c = get_cluster(name, nodes=3)
    assert cluster_from_mapping(c.to_mapping()) == c


def test_nvl72_is_one_nvlink_domain_of_72_and_nodes_count_racks():
    c = get_cluster("gb200-nvl72", nodes=4)
    assert c.gpus_per_node == 72 and c.num_gpus == 288
    assert c.link_for_span(72) is c.intra_node
    assert c.link_for_span(73) is c.inter_node


def test_tp64_on_nvl72_is_priced_on_nvlink_not_the_inter_rack_network():
    # group_shape(64, 1, 72) in planner/search/placement.py: 64 consecutive ranks in one rack
    c = get_cluster("gb200-nvl72", nodes=2)
    nbytes = 256e6
    tp64 = GroupShape(size=64, per_node=min(64, c.gpus_per_node))
    on_rack = allreduce_s(nbytes, tp64, c)
    assert on_rack == pytest.approx(ring_allreduce_s(nbytes, 64, c.intra_node))
    assert on_rack < ring_allreduce_s(nbytes, 64, c.inter_node) / 10
    # the same group on 8-GPU DGX B200 nodes runs hierarchically over InfiniBand: each GPU's
    # 400 Gb/s NIC carries its 1/8 share across nodes, slower than the rack's NVLink ring
    dgx = get_cluster("dgx-b200", nodes=16)
    across = allreduce_s(nbytes, GroupShape(size=64, per_node=8), dgx)
    assert across == pytest.approx(ring_allreduce_s(nbytes / 8, 8, dgx.inter_node)
                                   + 2 * 7 * dgx.intra_node.latency_s)  # NVLink's latency too
    assert across > 1.2 * on_rack


def test_memory_is_what_nvml_reports_where_a_reading_is_published():
    """The data sheets' "80 GB" of an H100 is 81,559 MiB usable, 7% more than 80e9 bytes; a
    preset without a published reading keeps the data sheet's GB (a lower bound)."""
    mib = 2 ** 20
    assert DEVICES["h100"].memory_bytes == 81_559 * mib == 85_520_809_984
    assert DEVICES["a100-80g"].memory_bytes == 81_920 * mib
    assert DEVICES["h200"].memory_bytes == 143_771 * mib
    assert DEVICES["b200"].memory_bytes == 183_359 * mib
    assert DEVICES["gb200"].memory_bytes == 186e9  # (no published reading: the data sheet's)
    assert get_cluster("dgx-h100").device.memory_bytes == DEVICES["h100"].memory_bytes


def test_a_cluster_file_sets_the_window_row_work_and_a_device_keeps_it_through_its_mapping():
    from costmodels.hardware import HOPPER_KERNELS, device_from_mapping, device_mapping
    spec = {"name": "h100-500w", "memory_GB": 96, "hbm_GBps": 2400, "sm_count": 132,
            "peak_TFLOPs": {"bf16": 800, "fp16": 800, "fp32": 67, "fp8": 1600}, **HOPPER_KERNELS}
    d = device_from_mapping(spec)
    assert (d.attention_window_keys, d.attention_bwd_window_keys) == (180.0, 560.0)
    assert device_from_mapping(device_mapping(d)) == d
    with pytest.raises(Exception, match=r"^device.attention_window_keys: expected a positive"):
        device_from_mapping({**spec, "attention_window_keys": 0})
