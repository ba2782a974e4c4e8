"""The sites YAML form, link units and scopes."""

import pytest

from costmodels.errors import SpecError
from costmodels.linkunits import parse_bandwidth, parse_latency
from costmodels.sites import sites_from_mapping, with_site_bandwidth


def site(name, nodes=2, gpn=8):
    return {"name": name, "device": "h100", "nodes": nodes, "gpus_per_node": gpn,
            "intra_node": {"bandwidth": "450GB/s", "latency": "3us"},
            "inter_node": {"bandwidth": "400Gbps", "latency": "10us", "per": "node"}}


def two(**link):
    return {"name": "t", "sites": [site("a"), site("b")],
            "links": [{"between": ["a", "b"], "bandwidth": "10Gbps", "latency": "30ms", **link}]}


@pytest.mark.parametrize("text,want", [("10Gbps", 1.25e9), ("1.25GB/s", 1.25e9),
                                       ("100 Mbps", 12.5e6), ("25 Gb/s", 3.125e9), (2, 2e9)])
def test_bandwidth_units(text, want):
    assert parse_bandwidth(text, "x") == pytest.approx(want)


@pytest.mark.parametrize("text,want", [("30ms", 0.03), ("5us", 5e-6), ("0.5s", 0.5), (10, 1e-5)])
def test_latency_units(text, want):
    assert parse_latency(text, "x") == pytest.approx(want)


@pytest.mark.parametrize("value", [-1, "-1", "0", "-1Gbps", "-0.5GB/s", "0Mbps"])
def test_a_bandwidth_of_zero_or_less_is_refused_as_not_positive(value):
    """A new-user check: --vary inter_node_bandwidth=-1 said "expected a bandwidth like
    10Gbps...", though a plain number is read (=5 works): a sign was not read at all."""
    with pytest.raises(SpecError, match=r"^vary\.inter_node_bandwidth: must be positive, got "
                       r".*; give a bandwidth above 0, like 10Gbps or 1\.25GB/s$"):
        parse_bandwidth(value, "vary.inter_node_bandwidth")


def test_a_negative_latency_is_refused_as_out_of_range():
    with pytest.raises(SpecError, match=r"^x: expected a latency from 0 to 60 s, got '-5us'"):
        parse_latency("-5us", "x")


@pytest.mark.parametrize("bad", ["10 furlongs", "-3Gbps", "fast", True])
def test_bad_bandwidth_names_the_field(bad):
    with pytest.raises(SpecError, match="links.0.bandwidth|links\\[0\\].bandwidth"):
        sites_from_mapping(two(bandwidth=bad))


def test_sites_become_groups_with_a_link_per_pair():
    hc = sites_from_mapping(two())
    assert [g.name for g in hc.groups] == ["a", "b"] and hc.num_gpus == 32
    link = hc.site_link(1, 0)
    assert link.bandwidth_bytes_per_s == pytest.approx(1.25e9) and link.latency_s == 0.03
    assert link.per == "site"
    # a per-node figure inside a site is shared by the node's 8 GPUs
    assert hc.groups[0].inter_node.bandwidth_bytes_per_s == pytest.approx(50e9 / 8)


def test_scope_shares_the_link():
    hc = sites_from_mapping(two())
    pipe = hc.site_link(0, 1)
    # 16 GPUs sending 1 GB in all over one site pipe take 16x one GPU's share of a per-gpu link
    per_site = pipe.transfer_s(1e9, gpus=16, nodes=2)
    per_gpu = sites_from_mapping(two(per="gpu")).site_link(0, 1).transfer_s(1e9, gpus=16, nodes=2)
    assert per_site - 0.03 == pytest.approx(16 * (per_gpu - 0.03))
    assert with_site_bandwidth(hc, 2.5e9).site_link(0, 1).bandwidth_bytes_per_s == 2.5e9


@pytest.mark.parametrize("change,words", [
    ({"links": []}, "no link between a and b"),
    ({"links": [{"between": ["a", "c"], "bandwidth": "1Gbps", "latency": "1ms"}]}, "unknown site"),
    ({"sites": [site("a")]}, "at least two sites"),
    ({"sites": [site("a"), site("a")]}, "listed twice"),
    ({"colour": "red"}, "unknown key"),
    ({"links": [{"between": ["a", "b"], "bandwidth": 1.2, "latency": "1ms"}]},
     r"links\[0\]\.bandwidth: 1\.2 has no unit; write it with one, like 10Gbps or 1\.25GB/s, "
     r"or give bandwidth_GBps: 1\.2 for a plain number"),
    ({"links": [{"between": ["a", "b"], "bandwidth": "1Gbps", "latency": "10"}]},
     r"links\[0\]\.latency: '10' has no unit; .* latency_us: 10 for a plain number"),
])
def test_bad_forms_are_one_line_errors(change, words):
    with pytest.raises(SpecError, match=words):
        sites_from_mapping({**two(), **change})


def test_default_link_fills_missing_pairs():
    spec = {"name": "t", "sites": [site("a"), site("b"), site("c")],
            "links": [{"between": ["a", "b"], "bandwidth": "10Gbps", "latency": "30ms"}],
            "default_link": {"bandwidth": "1Gbps", "latency": "80ms"}}
    hc = sites_from_mapping(spec)
    assert hc.site_link(0, 2).latency_s == pytest.approx(0.08)
    assert hc.site_link(2, 1).bandwidth_bytes_per_s == pytest.approx(0.125e9)


def test_a_plain_cluster_reads_a_nodes_link_figure_as_the_sites_form_does():
    """A new-user check: trimming a sites file to one site (as the alone line advises) kept
    `per: node`, which the plain form refused."""
    from costmodels.topology import cluster_from_mapping

    spec = {"name": "one", "device": "h100", "nodes": 4, "gpus_per_node": 8,
            "intra_node": {"bandwidth": "900GB/s", "latency": "3us"},
            "inter_node": {"bandwidth": "3200Gbps", "latency": "10us", "per": "node"}}
    assert cluster_from_mapping(spec).inter_node.bandwidth_bytes_per_s == 50e9
    with pytest.raises(SpecError, match=r"inter_node\.per: expected gpu or node"):
        cluster_from_mapping({**spec, "inter_node": {**spec["inter_node"], "per": "rack"}})


def test_the_groups_form_reads_a_nodes_figure_where_it_has_one_gpu_count_per_node():
    """A new-user check: `per: node` on inter_group was refused as "expected gpu or node, got
    'node'", and on inter_node wherever the groups' nodes differ, though each group has its own
    count of GPUs per node. Each group reads inter_node with its own; the link between groups
    with theirs where they share one, else the error says why and what to write."""
    from costmodels.topology import hetero_from_mapping

    node = {"bandwidth": "3200Gbps", "latency": "10us", "per": "node"}
    groups = [{"name": n, "device": "h100", "nodes": 2, "gpus_per_node": 8,
               "intra_node": {"bandwidth": "900GB/s", "latency": "3us"}} for n in "ab"]
    spec = {"name": "two", "groups": groups, "inter_node": node, "inter_group": node}
    hc = hetero_from_mapping(spec)
    assert hc.inter_group.bandwidth_bytes_per_s == 50e9
    assert all(g.inter_node.bandwidth_bytes_per_s == 50e9 for g in hc.groups)
    narrow = [groups[0], {**groups[1], "gpus_per_node": 4}]
    per_gpu = {"bandwidth": "400Gbps", "latency": "10us"}
    hc = hetero_from_mapping({**spec, "groups": narrow, "inter_group": per_gpu})
    assert [g.inter_node.bandwidth_bytes_per_s for g in hc.groups] == [50e9, 100e9]
    with pytest.raises(SpecError, match=r"^cluster\.inter_group\.per: node shares a node's "
                       r"figure among its GPUs, but the groups have 4 and 8 GPUs per node; give "
                       r"the figure per GPU"):
        hetero_from_mapping({**spec, "groups": narrow})
    with pytest.raises(SpecError, match=r"^cluster\.inter_node\.per: .* with no inter_group it "
                       r"joins the groups too; give inter_group"):
        hetero_from_mapping({"name": "two", "groups": narrow, "inter_node": node})


def test_a_sites_missing_key_comes_with_an_example():
    """A new-user check: 'sites[1].nodes: missing' said no more, where the plain form gives an
    example and the form's place in the README."""
    site = {"name": "a", "device": "h100", "nodes": 1, "gpus_per_node": 8,
            "intra_node": {"bandwidth": "900GB/s", "latency": "3us"},
            "inter_node": {"bandwidth": "400Gbps", "latency": "5us"}}
    spec = {"name": "two", "sites": [site, {k: v for k, v in site.items() if k != "nodes"}],
            "links": [{"between": ["a", "a"], "bandwidth": "10Gbps", "latency": "20ms"}]}
    with pytest.raises(SpecError, match=r"sites\[1\].nodes: missing \(e.g. nodes: 2; see the "
                                        r"sites form in README.md\)"):
        sites_from_mapping(spec)


def test_sites_of_one_device_name_it_once_and_missing_link_figures_show_the_form_used():
    """A new-user check read 'h100+h100' for two sites of H100; a link given as bandwidth_GBps
    without its latency was shown 'latency: 30ms' (the other form, a WAN's figure)."""
    from costmodels.linkunits import link_figures

    site = {"device": "h100", "nodes": 1, "gpus_per_node": 8,
            "intra_node": {"bandwidth": "900GB/s", "latency": "3us"},
            "inter_node": {"bandwidth": "400Gbps", "latency": "5us"}}
    two = sites_from_mapping({"name": "two", "sites": [{**site, "name": "a"},
                                                       {**site, "name": "b"}],
                              "links": [{"between": ["a", "b"], "bandwidth": "10Gbps",
                                         "latency": "20ms"}]})
    assert two.summary()["device"] == "h100"
    with pytest.raises(SpecError, match=r"^x.latency: missing \(e.g. latency_us: 5; a link "):
        link_figures({"bandwidth_GBps": 50}, "x")
    with pytest.raises(SpecError, match=r"^x.latency: missing \(e.g. latency: 5us; a link "):
        link_figures({"bandwidth": "400Gbps"}, "x")
    with pytest.raises(SpecError, match=r"^x.bandwidth: missing \(e.g. bandwidth_GBps: 50\)"):
        link_figures({"latency_us": 5}, "x")


def test_a_sites_link_takes_its_own_alltoall_efficiency():
    """A review found the sites form refusing the key the cluster form reads."""
    spec = two()
    spec["sites"][0]["intra_node"]["alltoall_efficiency"] = 0.6
    hc = sites_from_mapping(spec)
    assert hc.groups[0].intra_node.alltoall_efficiency == 0.6
    assert hc.groups[1].intra_node.alltoall_efficiency is None  # the collectives' figure
    spec["sites"][0]["intra_node"]["alltoall_efficiency"] = 2
    with pytest.raises(SpecError, match=r"sites\[0\]\.intra_node\.alltoall_efficiency: "):
        sites_from_mapping(spec)
