"""The suite's ``xdist_group`` marks reach the ``loadgroup`` scheduler (tests/conftest.py)."""

import pytest


@pytest.mark.xdist_group("xdist_groups")
def test_an_xdist_group_is_in_the_node_id_the_scheduler_reads(request):
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("::test_an_xdist_group_is_in_the_node_id_the_scheduler_reads@xdist_groups")
    else:  # one process (-p no:xdist, -n 0): no scheduler, the id is pytest's own
        assert "@" not in request.node.nodeid
