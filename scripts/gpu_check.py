"""GPU checks of the runtime (run by scripts/gpu_check.sh on a CUDA machine).

1. one process, plan over cpu + every GPU (copy streams): outputs, loss and
   gradients match the unplaced model on the CPU;
2. overhead: all ops on cuda:0 vs plain PyTorch on cuda:0;
3. profile on the local devices, then predicted vs measured for a cpu/GPU plan;
4. two ranks (gloo, GPU tensors staged through host memory) match too.
Prints one JSON document; exits 1 if a correctness check fails.
"""

import functools
import json
import sys

import torch

import placer
import placer.runtime
from placer import zoo


def main() -> int:
    sys.path.insert(0, "tests")
    from runtime_helpers import random_plan, reference
    assert torch.cuda.is_available(), "no CUDA device"
    out = {"gpus": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0)}
    ok = True
    model, inputs = zoo.build("gpt-125m", tiny=True, batch=8)
    graph = placer.trace(model, inputs)
    ref_out, ref_loss, ref_grads = reference(model, inputs)
    devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if len(devices) == 2:
        devices.append("cuda:0")  # still exercise a 3-device plan
    names = sorted(set(devices))
    for seed, schedule in ((0, "1f1b"), (1, "gpipe"), (2, "1f1b")):
        plan = random_plan(graph, names, seed=seed, microbatches=2, schedule=schedule)
        r = placer.runtime.run(model, plan, inputs, steps=2, warmup=1, graph=graph)
        err = max((r.gradients[k] - g).abs().max().item() for k, g in ref_grads.items())
        err = max(err, (r.outputs - ref_out).abs().max().item(), abs(r.loss - ref_loss))
        out[f"single_process_seed{seed}_max_err"] = err
        ok &= err < 1e-3  # TF32 / different kernels on GPU
    # overhead on one GPU, larger model
    big, big_in = zoo.build("gpt-125m", batch=8, seq=256, n_layer=4, device="cuda")
    g2 = placer.trace(big, big_in)
    opt = torch.optim.SGD(big.parameters(), lr=1e-3)
    import statistics
    import time
    ts = []
    for i in range(13):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        placer.runtime.default_loss(big(*big_in)).backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 3:
            ts.append(time.perf_counter() - t)
    plain = statistics.median(ts)
    plan = placer.Plan({op: ["cuda:0"] for op in g2.ids})
    r = placer.runtime.run(big, plan, big_in, steps=10, warmup=3, graph=g2,
                           optimizer=functools.partial(torch.optim.SGD, lr=1e-3))
    out["overhead"] = {"plain": plain, "placed": r.report.step_time,
                       "ratio": r.report.step_time / plain - 1}
    # calibration: profile here, predict a cpu+gpu pipeline
    from placer.runtime.profile import profile
    pg, pc = profile(model, inputs, repeats=3)
    plan = random_plan(pg, names, seed=3, microbatches=2, dp=0.0)
    r = placer.runtime.run(model, plan, inputs, steps=5, warmup=2, graph=pg, cluster=pc)
    out["calibrated"] = {"measured": r.report.step_time, "predicted": r.report.predicted,
                         "efficiency": {d.name: d.efficiency for d in pc.devices}}
    # two ranks over gloo with CUDA tensors
    from placer.runtime.dist import launch
    build = functools.partial(zoo.build, "gpt-125m", tiny=True, batch=8)
    plan = random_plan(graph, ["cuda:0", "cpu"], seed=4, microbatches=2)
    res = launch(plan, build, steps=1, warmup=0, timeout=300)
    err = max((res["gradients"][k] - g).abs().max().item() for k, g in ref_grads.items())
    out["two_ranks_max_err"] = err
    ok &= err < 1e-3
    out["ok"] = bool(ok)
    print(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
