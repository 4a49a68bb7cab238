"""``transports.netdevs``: the UCX devices that keep UCX's listeners on the agent's address."""

from dataplane.transports.netdevs import interface_of, net_devices_for, rdma_ports


def test_loopback_is_lo_and_unknown_or_wildcard_addresses_have_no_interface():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("0.0.0.0") is None
    assert interface_of("198.51.100.254") is None  # TEST-NET-2: on no interface here
    assert interface_of("::1") is None and interface_of("localhost") is None


def test_rdma_ports_are_named_as_ucx_names_them(tmp_path):
    for dev, ports in (("mlx5_1", ("1",)), ("mlx5_0", ("2", "1"))):
        for port in ports:
            (tmp_path / dev / "ports" / port).mkdir(parents=True)
    assert rdma_ports(tmp_path) == ["mlx5_0:1", "mlx5_0:2", "mlx5_1:1"]
    assert rdma_ports(tmp_path / "absent") == []
    assert net_devices_for("127.0.0.1", tmp_path) == "lo,mlx5_0:1,mlx5_0:2,mlx5_1:1"
    assert net_devices_for("0.0.0.0", tmp_path) is None
