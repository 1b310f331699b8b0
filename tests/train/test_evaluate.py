"""The held-out evaluation during training (toolkit/train/evaluate.py)."""
import torch



def test_an_offline_run_whose_target_does_not_fit_trains_without_evaluation(tiny_target, monkeypatch, capsys):
    """Offline training has no target in it; its held-out evaluation loads one on the main process. On a card
    smaller than the target that load failed at the first evaluation, with the other ranks waiting at the barrier
    until their timeout (and every --resume failing alike): it is found at the start and evaluation is off, said."""
    from types import SimpleNamespace

    from toolkit.infer import kv_cache, loading
    from toolkit.train.evaluate import HeldOutEval

    waits = []
    acc = SimpleNamespace(is_main_process=True, device="cpu", get_state_dict=lambda model: {},
                          wait_for_everyone=lambda: waits.append(1))
    cfg = SimpleNamespace(eval_samples=2)
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 1024)  # 1 KiB free
    run_eval = HeldOutEval(acc, None, [], cfg, tiny_target, set(), torch.float32)
    assert "held-out evaluation is off for this run" in capsys.readouterr().err and "GiB" in run_eval.off

    def refuse(*a, **k):
        raise AssertionError("the target was loaded")
    monkeypatch.setattr(loading, "load_target", refuse)
    run_eval(None, 100, None)
    assert waits == [1]  # the other ranks are not left waiting
    monkeypatch.setattr(kv_cache, "free_memory_bytes", lambda device: 2 ** 40)
    assert HeldOutEval(acc, None, [], cfg, tiny_target, set(), torch.float32).off is None
