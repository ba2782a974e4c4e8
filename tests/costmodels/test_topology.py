"""Presets, overrides and the strict cluster YAML form."""

import pytest

from costmodels.errors import SpecError
from costmodels.hardware import DEVICES, get_device
from costmodels.topology import CLUSTERS, cluster_from_mapping, get_cluster

GOOD = {
    "name": "my-cluster", "device": "a100-80g", "nodes": 16, "gpus_per_node": 8,
    "intra_node": {"bandwidth_GBps": 300, "latency_us": 3},
    "inter_node": {"bandwidth_GBps": 25, "latency_us": 10},
}


def test_required_presets_exist():
    for name in ("a100-40g", "a100-80g", "h100", "h200", "v100", "l4", "rtx4090", "cpu", "b200",
                 "gb200", "b300", "gb300", "mi300x"):
        assert name in DEVICES
    for name in ("dgx-a100-80g", "dgx-h100", "hgx-h200", "pcie-4090", "dgx-b200", "dgx-b300",
                 "gb200-nvl72", "gb300-nvl72", "mi300x-8"):
        assert name in CLUSTERS
    assert DEVICES["h200"].memory_bytes == 143_771 * 2 ** 20  # (NVML's reading of "141 GB")
    assert DEVICES["a100-80g"].peak("bf16") == 312e12


def test_overrides_and_unknown_names_suggest():
    c = get_cluster("dgx-h100", nodes=256)
    assert c.num_gpus == 2048
    with pytest.raises(SpecError, match="did you mean dgx-h100"):
        get_cluster("dgx-h10")
    with pytest.raises(SpecError, match="nodes"):
        get_cluster("dgx-h100", nodes=0)
    with pytest.raises(SpecError, match="did you mean"):
        get_device("a100-80")


def test_yaml_form_loads_and_is_strict():
    c = cluster_from_mapping(GOOD)
    assert c.num_gpus == 128 and c.inter_node.bandwidth_bytes_per_s == 25e9
    with pytest.raises(SpecError, match=r"cluster\.gpus_per_nod: unknown key; did you mean "
                                        r"gpus_per_node\?$"):
        cluster_from_mapping({**GOOD, "gpus_per_nod": 8})
    # a slip in a nested key is named with its closest key; a key near none lists them all
    with pytest.raises(SpecError, match=r"cluster\.intra_node\.bandwith_GBps: unknown key; did "
                                        r"you mean bandwidth_GBps\?$"):
        cluster_from_mapping({**GOOD, "intra_node": {"bandwith_GBps": 300, "latency_us": 3}})
    with pytest.raises(SpecError, match=r"cluster\.colour: unknown key; choose one of "
                                        r"description, device, "):
        cluster_from_mapping({**GOOD, "colour": "red"})
    # YAML reads on:, yes:, 1: and ~: as keys that are not text: still a one-line error
    for key in (True, 1, None):
        with pytest.raises(SpecError, match=rf"^cluster\.{key}: unknown key; "):
            cluster_from_mapping({**GOOD, key: 3})
    bad = dict(GOOD)
    del bad["inter_node"]
    with pytest.raises(SpecError, match=r"cluster\.inter_node: missing"):
        cluster_from_mapping(bad)
    with pytest.raises(SpecError, match=r"intra_node\.bandwidth_GBps"):
        cluster_from_mapping({**GOOD, "intra_node": {"bandwidth_GBps": -1, "latency_us": 3}})


def test_a_cluster_files_links_take_units_as_a_sites_file_does():
    """bandwidth/latency with units, as in the sites form; a bare number there is refused."""
    plain = cluster_from_mapping(GOOD)
    units = cluster_from_mapping({**GOOD, "inter_node": {"bandwidth": "200Gbps",
                                                         "latency": "10us"}})
    assert units.inter_node == plain.inter_node
    with pytest.raises(SpecError, match=r"inter_node\.bandwidth: 200 has no unit"):
        cluster_from_mapping({**GOOD, "inter_node": {"bandwidth": 200, "latency": "10us"}})
    with pytest.raises(SpecError, match=r"inter_node: give bandwidth or bandwidth_GBps, not both"):
        cluster_from_mapping({**GOOD, "inter_node": {"bandwidth": "200Gbps", "bandwidth_GBps": 25,
                                                     "latency_us": 10}})
    with pytest.raises(SpecError, match=r"inter_node\.latency: missing"):
        cluster_from_mapping({**GOOD, "inter_node": {"bandwidth_GBps": 25}})
    with pytest.raises(SpecError, match=r"inter_node\.bandwidth_GBps: '200Gbps' has a unit; give "
                                        r"bandwidth: 200Gbps"):
        cluster_from_mapping({**GOOD, "inter_node": {"bandwidth_GBps": "200Gbps",
                                                     "latency_us": 10}})
    with pytest.raises(SpecError, match=r"inter_node\.latency_us: '10ms' has a unit"):
        cluster_from_mapping({**GOOD, "inter_node": {"bandwidth_GBps": 25, "latency_us": "10ms"}})
    # a word, not a quantity: no "give bandwidth: fast" (a new-user check)
    with pytest.raises(SpecError, match=r"inter_node\.bandwidth_GBps: 'fast' is not a number; "
                                        r"give a plain number for bandwidth_GBps, or bandwidth "
                                        r"with its unit"):
        cluster_from_mapping({**GOOD, "inter_node": {"bandwidth_GBps": "fast", "latency_us": 10}})


def test_device_mapping_in_yaml():
    spec = {**GOOD, "device": {"name": "x1", "memory_GB": 64, "hbm_GBps": 2000,
                                "peak_TFLOPs": {"bf16": 400, "fp32": 50}}}
    c = cluster_from_mapping(spec)
    assert c.device.peak("bf16") == 400e12 and c.device.memory_bytes == 64e9
    with pytest.raises(SpecError, match=r"device\.peak_TFLOPs\.int8"):
        cluster_from_mapping({**spec, "device": {**spec["device"], "peak_TFLOPs": {"int8": 1}}})


def test_a_custom_device_survives_its_yaml_form():
    from costmodels.hardware import device_from_mapping, device_mapping

    spec = {"name": "x", "memory_GB": 96, "hbm_GBps": 2400, "sm_count": 132,
            "peak_TFLOPs": {"bf16": 886, "fp8": 1772}, "fp8_matmul_efficiency": 0.6,
            "attention_efficiency": 0.5, "attention_bwd_efficiency": 0.4,
            "flash2_efficiency": 0.3, "flash2_bwd_efficiency": 0.25}
    d = device_from_mapping(spec)
    assert device_from_mapping(device_mapping(d)) == d
    assert device_mapping(d)["attention_bwd_efficiency"] == 0.4


def test_a_device_on_a_preset_keeps_the_figures_it_does_not_give():
    """A new-user check wrote a B200 with FP8 in its own words and got a device 13% faster than
    the preset (no Blackwell attention speeds, which the form cannot know): `base: b200` keeps
    every figure not given; a peak_TFLOPs given replaces the preset's mapping whole."""
    from costmodels.hardware import device_from_mapping

    b200 = get_device("b200")
    d = device_from_mapping({"base": "b200", "peak_TFLOPs": {"bf16": 2000, "fp8": 4000}})
    assert d.name == "b200-custom" and d.peak("fp8") == 4000e12
    assert d.attention_efficiency == b200.attention_efficiency
    assert d.fp8_block_scaling and d.memory_bytes == b200.memory_bytes
    with pytest.raises(SpecError, match=r"^dtype: device b200-custom has no fp32 support"):
        d.peak("fp32")
    assert device_from_mapping({"base": "B200", "name": "mine"}) == \
        device_from_mapping({"base": "b200", "name": "mine"})
    with pytest.raises(SpecError, match=r"^device.base: unknown device 'b201'"):
        device_from_mapping({"base": "b201"})
    # another preset's name would stand for that preset in prices, groups and reports (a
    # new-user check named a v100 "a100-80g"); the base's own name is the base
    with pytest.raises(SpecError, match=r"^device.name: 'a100-80g' is another preset's name "
                                        r"\(this device is based on v100\)"):
        device_from_mapping({"base": "v100", "name": "a100-80g", "memory_GB": 16})
    assert device_from_mapping({"base": "v100", "name": "v100"}).name == "v100"
    with pytest.raises(SpecError, match=r"^device.memory_GB: missing; .*or base: a preset"):
        device_from_mapping({"name": "x", "peak_TFLOPs": {"bf16": 1}, "hbm_GBps": 1})
    with pytest.raises(SpecError, match=r"lists the dtypes it runs, with their TFLOP/s, under "
                                        r"peak_TFLOPs\)$"):
        get_device("a100-80g").peak("fp8")


def test_a_device_on_a_preset_reads_back_with_the_figures_a_file_cannot_set():
    """A plan keeps its cluster in the file's form (plan show --why, the exports' memory check
    rebuild it): a device on a preset keeps its base there, or it lost the preset's host link,
    GEMM tiles and per-kernel cost and was priced another way on re-planning (a code review)."""
    from costmodels.hardware import device_from_mapping, device_mapping

    for base in ("b200", "gb200", "cpu"):
        d = device_from_mapping({"base": base, "name": "mine", "memory_GB": 100})
        assert d.base == base and device_from_mapping(device_mapping(d)) == d
    assert "base" not in device_mapping(get_device("h100"))


SLOW = {"name": "slow-eth", "device": "h100", "nodes": 4, "gpus_per_node": 4,
        "intra_node": {"bandwidth": "64GB/s", "latency": "5us"},
        "inter_node": {"bandwidth": "25Gbps", "latency": "50us", "per": "node"}}
"""A cluster whose nodes share one 25 Gb/s NIC (3.125 GB/s a node)."""


@pytest.mark.parametrize("gpn", [1, 2, 8, 16])
def test_a_nodes_link_is_split_among_the_gpus_a_resize_puts_in_the_node(gpn):
    """A new-user check: --gpus-per-node 8 on a file of 4 GPUs per node kept each GPU's share of
    4 (0.78 GB/s, 1.64 s a step) where the same file written for 8 gives 0.39 GB/s (2.27 s)."""
    from costmodels.topology import with_overrides

    resized = with_overrides(cluster_from_mapping(SLOW), gpus_per_node=gpn)
    written = cluster_from_mapping({**SLOW, "gpus_per_node": gpn})
    assert resized.inter_node.bandwidth_bytes_per_s == pytest.approx(3.125e9 / gpn)
    assert resized.inter_node == written.inter_node
    assert resized.intra_node.bandwidth_bytes_per_s == 64e9  # (per GPU: no split)


def test_a_nodes_link_keeps_its_share_when_only_the_node_count_changes():
    from costmodels.topology import with_overrides

    c = with_overrides(cluster_from_mapping(SLOW), nodes=16)
    assert c.num_gpus == 64 and c.inter_node.bandwidth_bytes_per_s == pytest.approx(3.125e9 / 4)


def test_a_resized_clusters_yaml_form_reads_back_and_resizes_as_the_file_does():
    """The plan's cluster.spec writes a node's link as the node's figure with per: node, so a
    plan re-read (plan show, export, why-not) and resized again splits the node's NICs anew."""
    from costmodels.topology import with_overrides

    c = with_overrides(cluster_from_mapping(SLOW), gpus_per_node=8)
    spec = c.to_mapping()
    assert spec["inter_node"]["per"] == "node"
    assert spec["inter_node"]["bandwidth_GBps"] == pytest.approx(3.125)
    assert "per" not in spec["intra_node"]
    assert cluster_from_mapping(spec) == c
    assert c.summary()["inter_node_GBps"] == pytest.approx(3.125 / 8)
    again = with_overrides(cluster_from_mapping(spec), gpus_per_node=2)
    assert again.inter_node.bandwidth_bytes_per_s == pytest.approx(3.125e9 / 2)


def test_a_links_alltoall_efficiency_reads_back_and_is_checked():
    link = {"bandwidth_GBps": 450, "latency_us": 3, "efficiency": 0.82,
            "alltoall_efficiency": 0.6}
    c = cluster_from_mapping({**GOOD, "intra_node": link})
    assert c.intra_node.alltoall_bytes_per_s == pytest.approx(450e9 * 0.6)
    assert c.inter_node.alltoall_efficiency is None  # not given: the collectives' figure
    assert c.inter_node.alltoall_bytes_per_s == c.inter_node.effective_bytes_per_s
    again = cluster_from_mapping(c.to_mapping())
    assert again.intra_node == c.intra_node and again.inter_node == c.inter_node
    assert "alltoall_efficiency" not in c.to_mapping()["inter_node"]
    # a preset's measured figure survives its YAML form
    h = get_cluster("dgx-h100")
    assert cluster_from_mapping(h.to_mapping()).intra_node.alltoall_efficiency == 0.68
    with pytest.raises(SpecError, match=r"^cluster\.intra_node\.alltoall_efficiency: "):
        cluster_from_mapping({**GOOD, "intra_node": {**link, "alltoall_efficiency": 1.5}})
