"""deploy: and core.tensor_parallel: what each mode needs, and every contradiction named at load."""
from __future__ import annotations

import pytest

import kev

NATS = {"mode": "distributed", "nats_url": "nats://127.0.0.1:4222"}


def test_defaults_and_the_three_modes() -> None:
    assert kev.load_config({}).deploy.mode == "single"
    multi = kev.load_config({"deploy": {"mode": "multi_gpu", "devices": ["cuda:0", "cuda:1"]}}).deploy
    assert multi.devices == ("cuda:0", "cuda:1")
    dist = kev.load_config({"deploy": {**NATS, "workers": 3, "nats_user": "kev", "nats_password": "pw",
                                       "nats_tls": {"ca_file": "ca.pem"}}}).deploy
    assert dist.num_partitions == 3 and dist.nats_tls.ca_file == "ca.pem"
    assert kev.load_config({"deploy": {**NATS, "partitions": 8}}).deploy.num_partitions == 8


@pytest.mark.parametrize("deploy, key", [
    ({"mode": "distributed"}, "deploy.nats_url"),
    ({"nats_url": "nats://x:4222"}, "deploy.nats_url"),
    ({**NATS, "nats_url": "http://x:4222"}, "deploy.nats_url"),
    ({**NATS, "nats_user": "kev"}, "deploy.nats_user"),
    ({**NATS, "nats_user": "kev", "nats_password": "pw", "nats_token": "t"}, "deploy.nats_token"),
    ({**NATS, "nats_tls": {"cert_file": "c.pem"}}, "deploy.nats_tls"),
    ({**NATS, "subject_prefix": "kev.prod"}, "deploy.subject_prefix"),
    ({**NATS, "ack_wait_s": 0.1}, "kev.deploy.ack_wait_s"),
    ({"mode": "multi_gpu"}, "deploy.devices"),
    ({"devices": ["cpu"]}, "deploy.devices"),
    ({"mode": "cluster"}, "kev.deploy.mode"),
])
def test_deploy_contradictions_name_the_key(deploy: dict, key: str) -> None:
    with pytest.raises(kev.ConfigError, match=key.replace(".", r"\.")):
        kev.load_config({"deploy": deploy})


def test_partitions_must_hold_the_routers_groups() -> None:
    tiers = {"strategy": "length_aware", "length_tiers": [64, 512]}  # three channel groups
    with pytest.raises(kev.ConfigError, match=r"deploy\.partitions"):
        kev.load_config({"deploy": {**NATS, "workers": 2}, "router": tiers})
    with pytest.raises(kev.ConfigError, match=r"deploy\.devices"):
        kev.load_config({"deploy": {"mode": "multi_gpu", "devices": ["cpu", "cpu"]}, "router": tiers})
    assert kev.load_config({"deploy": {**NATS, "partitions": 3}, "router": tiers}).deploy.num_partitions == 3


def test_tensor_parallel_groups_must_fill_the_devices() -> None:
    assert kev.load_config({"core": {"tensor_parallel": 2}}).core.tensor_parallel == 2  # single: ranks on core.device
    multi = kev.load_config({"deploy": {"mode": "multi_gpu", "devices": ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]},
                             "core": {"tensor_parallel": 2}})
    assert len(multi.deploy.devices) // multi.core.tensor_parallel == 2  # two replicas of two ranks
    with pytest.raises(kev.ConfigError, match=r"deploy\.devices \(3\).*core\.tensor_parallel \(2\)"):
        kev.load_config({"deploy": {"mode": "multi_gpu", "devices": ["cuda:0", "cuda:1", "cuda:2"]},
                         "core": {"tensor_parallel": 2}})
    with pytest.raises(kev.ConfigError, match=r"core\.tensor_parallel"):
        kev.load_config({"core": {"tensor_parallel": 0}})
    tiers = {"strategy": "length_aware", "length_tiers": [64]}  # two channel groups: two replicas needed
    with pytest.raises(kev.ConfigError, match=r"deploy\.devices.*got 1"):
        kev.load_config({"deploy": {"mode": "multi_gpu", "devices": ["cpu", "cpu"]}, "core": {"tensor_parallel": 2},
                         "router": tiers})
