"""Trace a small model, plan it, run the plan here and check it is exact.

A tiny GPT from the model zoo is traced into a graph and placed on a
two-device cluster (``left`` and ``right``, described as slow CPUs so that
splitting pays) as a pipeline (``even_pipeline``) and by hand as pure data
parallelism, and on ``Cluster.local()`` (this machine's CPU and any CUDA
GPUs) by ``heft``. Each plan is run with :func:`placer.run`. Plan devices that are not torch devices (like
``left``) run on the CPU, so this works on any laptop. The outputs, loss and
gradients are compared with the unplaced model's.

    python examples/run_locally.py          # ~10 s on a laptop CPU

Prints the plans, the measured vs predicted step time, and for each plan
``outputs match: True`` with the largest differences.
"""

from __future__ import annotations

import torch

import placer
from placer.runtime.run import default_loss


def reference(model, inputs):
    """Outputs, loss and gradients of one step of the unplaced model."""
    model.zero_grad()
    outputs = model(*inputs)
    loss = default_loss(outputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad()
    return outputs.detach(), float(loss.detach()), grads


def two_devices() -> placer.Cluster:
    devices = [placer.Device("left", flops=2e9, memory=8e9, site="here", kind="cpu"),
               placer.Device("right", flops=2e9, memory=8e9, site="there", kind="cpu")]
    return placer.Cluster.from_rules("left-right", devices, default=(1e10, 1e-5),
                                     sites=[("here", "there", 1e10, 1e-5)])


def main() -> int:
    torch.manual_seed(0)
    model, inputs = placer.datasets.model("gpt-125m", batch=4, seq=16, tiny=True)
    graph = placer.trace(model, inputs, granularity="module", name="gpt-tiny")
    totals = graph.totals()
    print(f"traced {graph.name}: {totals['ops']} ops, {totals['edges']} edges, "
          f"{totals['param_bytes'] / 1e6:.2f} MB of parameters")
    ref_out, ref_loss, ref_grads = reference(model, inputs)

    pair = two_devices()
    # Every op on both devices: data-parallel, gradients all-reduced.
    replicated = placer.Plan({op_id: ["left", "right"] for op_id in graph.ids},
                             microbatches=2, schedule="gpipe", method="manual data-parallel")
    cases = [(pair, "even_pipeline", None), (pair, "manual", replicated),
             (placer.Cluster.local(), "heft", None)]
    ok = True
    for cluster, method, plan in cases:
        if plan is None:
            plan = placer.optimize(graph, cluster, method=method, seed=0, time_budget=5,
                                   microbatches=2)
        per_device: dict[str, int] = {}
        for devices in plan.placement.values():
            for d in devices:
                per_device[d] = per_device.get(d, 0) + 1
        print(f"\n{plan.method} on {cluster.name} ({', '.join(cluster.names)}): "
              f"ops per device {per_device}, {plan.microbatches} microbatches, {plan.schedule}")
        result = placer.run(model, plan, inputs, steps=3, graph=graph, cluster=cluster)
        report = result.report
        predicted = "n/a" if report.predicted is None else f"{report.predicted * 1e3:.2f} ms"
        print(f"measured step {report.step_time * 1e3:.2f} ms, predicted {predicted}")
        out_diff = (result.outputs - ref_out).abs().max().item()
        grad_diff = max((result.gradients[n] - g).abs().max().item()
                        for n, g in ref_grads.items())
        match = (torch.allclose(result.outputs, ref_out, atol=1e-5, rtol=1e-4)
                 and abs(result.loss - ref_loss) < 1e-5 and grad_diff < 1e-5)
        ok &= match
        print(f"outputs match: {match} (max |output diff| {out_diff:.2e}, "
              f"loss {result.loss:.6f} vs {ref_loss:.6f}, max |grad diff| {grad_diff:.2e})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
