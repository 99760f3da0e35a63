"""hexagent_gym.cluster.cluster_sampling: random clusters (GPU mixes, sizes) and the cluster
registry."""

from __future__ import annotations

import pytest

from hexagent_gym.cluster.cluster import load_cluster, register_cluster
from hexagent_gym.cluster.cluster_sampling import ClusterDistribution, sample_clusters
from hexagent_gym.config import ConfigError
from hexagent_gym.episode import EpisodeConfig, EpisodeFactory


def test_draws_respect_the_ranges_and_gpus():
    dist = ClusterDistribution(gpus=("a100", "h200"), prefill=(2, 3), decode=(4, 5))
    names = sample_clusters(dist, 30, seed=7)
    shapes = set()
    for name in names:
        spec = load_cluster(name)
        P, D = len(spec.prefill), len(spec.decode)
        assert 2 <= P <= 3 and 4 <= D <= 5
        shapes.add((P, D))
        assert {i.gpu for i in spec.prefill + spec.decode} <= {"a100", "h200"}
        assert all(i.tp == 4 for i in spec.prefill + spec.decode)
        assert name.startswith(f"gen-{P}p{D}d-")
    assert shapes == {(2, 4), (2, 5), (3, 4), (3, 5)}  # 30 draws reach every size pair


def test_same_seed_same_clusters_and_names_follow_content():
    dist = ClusterDistribution()
    a = sample_clusters(dist, 5, seed=1)
    assert a == sample_clusters(dist, 5, seed=1)  # re-registering the same content is a no-op
    assert a != sample_clusters(dist, 5, seed=2)


def test_a_registered_cluster_serves_episodes_by_name():
    name = register_cluster({"name": "test-reg-1p1d", "model": "llama-3.1-70b",
                             "prefill": [{"gpu": "h100", "tp": 4, "count": 1}],
                             "decode": [{"gpu": "a100", "tp": 4, "count": 1}]})
    factory = EpisodeFactory(EpisodeConfig(cluster=name, num_workflows=3, load=0.5))
    result = factory.simulator(0, decisions=False).run()
    assert factory.cluster.name == name and len(result.ratios) == 3


@pytest.mark.parametrize(("spec", "message"), [
    ({"name": "hetero-1", "model": "llama-3.1-70b",
      "prefill": [{"gpu": "h100", "tp": 4}], "decode": [{"gpu": "h100", "tp": 4}]},
     "cannot register cluster 'hetero-1': a shipped cluster has that name"),
    ({"model": "llama-3.1-70b", "prefill": [{"gpu": "h100", "tp": 4}],
      "decode": [{"gpu": "h100", "tp": 4}]}, "needs a non-empty string 'name'"),
    ({"name": "x", "model": "llama-3.1-70b", "prefill": [{"gpu": "tpu", "tp": 4}],
      "decode": [{"gpu": "h100", "tp": 4}]}, "unknown gpu 'tpu'"),
])
def test_bad_registrations_name_the_problem(spec, message):
    with pytest.raises(ConfigError, match=message):
        register_cluster(spec)


def test_a_name_cannot_be_reused_for_other_content():
    base = {"name": "test-reg-twice", "model": "llama-3.1-70b",
            "prefill": [{"gpu": "h100", "tp": 4}], "decode": [{"gpu": "h100", "tp": 4}]}
    register_cluster(base)
    other = {**base, "decode": [{"gpu": "a100", "tp": 4}]}
    with pytest.raises(ConfigError, match="already registered with different content"):
        register_cluster(other)


@pytest.mark.parametrize(("fields", "message"), [
    ({"gpus": []}, "gpus must be a non-empty list of shipped GPU names"),
    ({"gpus": ["a100", "v100"]}, "gpus must be a non-empty list"),
    ({"prefill": [4, 2]}, "prefill must be \\[lowest, highest\\]"),
    ({"decode": [0, 2]}, "decode must be \\[lowest, highest\\]"),
    ({"tp": 0}, "tp must be an integer >= 1"),
    ({"model": "gpt-9"}, "unknown model 'gpt-9'"),
    ({"size": 3}, "unknown field 'size'; valid fields: model, tp, gpus, prefill, decode, network"),
])
def test_bad_distributions_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=f"mix.yaml: .*{message}"):
        ClusterDistribution.from_mapping(fields, "mix.yaml")
