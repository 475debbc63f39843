"""The spyre c10d backend on 2 and 4 ranks (processes): values, costs in the profile and the Chrome
trace, bad input, a rank that does not join."""

import pytest
import torch

from vspyre.distributed import SpyreDistributedError, backend, collectives, launch

from . import ranks


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_gives_the_values_of_its_definition(world):
    results = launch.run(ranks.collectives_values, world, timeout=240, collective_timeout=60)
    for rank, res in enumerate(results):
        names = [c[0] for c in res["collectives"]]
        for want in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"):
            assert want in names, (rank, names)
        assert ("send" in names) == (rank == 0) and ("recv" in names) == (rank == 1)
        for name, nbytes, est_us, ws, algo, executed in res["collectives"]:
            assert ws == world and executed and algo in ("ring", "p2p")
            assert est_us == pytest.approx(collectives.cost(name, nbytes, world).us)
        first = res["collectives"][0]
        assert first[:2] == ("all_reduce", 6 * 4)
        # the Chrome trace has each collective on its own row with bytes and time
        assert len(res["trace"]) == len(res["collectives"])
        assert {e["tid"] for e in res["trace"]} == {3}
        assert res["trace"][0]["args"]["bytes"] == 24 and res["trace"][0]["dur"] == pytest.approx(first[2])
        assert res["total_est_us"] >= res["collective_est_us"] > 0


def test_bad_input_names_the_devices_and_sizes_and_leaves_the_group_usable():
    errors = launch.run(ranks.bad_input, 2, timeout=180)
    for rank, errs in enumerate(errors):
        assert "no error" not in errs, errs
        assert f"spyre:{1 - rank}" in errs[0] and f"this rank's card, spyre:{rank}" in errs[0]
        assert f"spyre:{1 - rank}" in errs[1]
        assert "[5]" in errs[2] and "expected 4" in errs[2]
        assert "[1]" in errs[3] and "expected 2" in errs[3]
        assert "another rank" in errs[4] or "destination rank" in errs[4], errs[4]   # torch checks first


def test_a_rank_that_does_not_join_is_named_after_the_timeout():
    msg = launch.run(ranks.one_rank_does_not_join, 2, timeout=180, collective_timeout=3)[0]
    assert "rank 1" in msg and "did not join" in msg and "all_reduce" in msg, msg


def test_more_ranks_than_cards_is_an_error_naming_both(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(torch.spyre.device_count() + 1))
    with pytest.raises(SpyreDistributedError, match=rf"{torch.spyre.device_count() + 1} ranks on this machine but "
                                                    rf"{torch.spyre.device_count()} card"):
        backend._bind_card(0, torch.spyre.device_count() + 1, simulated=False)


def test_a_rank_failure_is_reported_with_its_rank():
    with pytest.raises(SpyreDistributedError, match=r"rank 1: .*ZeroDivisionError"):
        launch.run(_fail_on_rank_1, 2, timeout=120)


def _fail_on_rank_1(rank):
    return 1 / (1 - rank)
