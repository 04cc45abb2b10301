"""The concept x engine split that bench and the scaling reports print."""

from allreduce_train.experiments import engines


def test_the_horovod_vs_ps_ratio_splits_into_concept_and_implementation():
    lines = engines.markdown("lenet5, 2 ranks", {"trainer": 90.0, "trainer-mpi": 120.0, "trainer-ps": 100.0,
                                                 "horovod": 80.0}, engines.BENCH)
    text = "\n".join(lines)
    assert "| ring allreduce | 90 | 120 |" in text and "| PS colocated | – | 100 |" in text
    assert "ring / colocated PS = 1.20: the concept's" in text
    assert "Horovod / mpi4py = 0.75: the implementation's" in text
    assert "Horovod ring / colocated PS = 0.90 is their product (1.20 x 0.75)" in text


def test_without_the_second_engine_nothing_is_attributed():
    text = engines.verdict(engines.cells({"allreduce": 90.0, "ps-colocated": 100.0}, engines.SCALING))
    assert "0.90" in text and "cannot be told apart" in text
    assert engines.markdown("x", {"ps-dedicated": 0.0}, engines.SCALING) == []  # failed: no table
