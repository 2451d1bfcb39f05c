"""Eager determinism check (GPU, not run by CI): the first tensor that differs between two runs.

Runs the requests of `benchmarks/engine.py --check-graphs` through a fresh eager engine (overlapped
scheduling off) `--runs` times and records the output of every kernel call the model makes in
each step: the layer's norms and projections, the attention's preparation (the query's rotation
and the cache rows it writes), the indexer logits (inside each row's context: the columns past it
are left unwritten), the top-k slots (as they come, and as a set), the sparse attention, the MLP
and the LM head's logits. The first run's outputs stay on the device; each later run compares
its calls bitwise as they happen, in order, and prints the first call that differs (its step,
the batch's requests, the call's occurrence in the step, i.e. the layer, how many rows differ and
whose), with the next few; then it runs that call alone `--repeats` times on the same inputs and
counts results that differ from its first (a kernel that is not deterministic by itself shows
there). The greedy tokens of every run are compared too.

    PYTHONPATH=. python benchmarks/determinism.py --model small --runs 3
    PYTHONPATH=. python benchmarks/determinism.py --smoke   # tiny model on CPU: tests this script
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.engine import add_check_requests, add_model_args, check_engine  # noqa: E402
from kernels.quant import gather_indexer_rows  # noqa: E402
from server.engine.core import Engine  # noqa: E402
from server.model import attention, layers  # noqa: E402

# Calls that write their results into their inputs (a rotation in place, cache rows): not re-run alone.
IN_PLACE = ("mla_prepare_", "indexer_prepare")


def _indexer_outputs(args: tuple, out: torch.Tensor) -> list[torch.Tensor]:
    """The indexer's logits inside each row's context (context_lens: the 8th argument)."""
    cols = torch.arange(out.shape[1], device=out.device)
    return [torch.where(cols[None, :] < args[7][:, None].long(), out, 0.0)]


def _kv_rows(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The KV cache rows at slots (the KV cache is one row per slot)."""
    return cache[slots.long()]


def _indexer_keys(args: tuple) -> torch.Tensor:
    """The indexer keys indexer_prepare wrote (key [T, d_I], the cache, slots and key dtype: its
    2nd, 10th, 11th and 12th arguments), as rows; the cache is laid out per block (kernels/quant.py)."""
    return gather_indexer_rows(args[9], args[10], args[1].shape[-1], args[11])


# What each wrapped call's recorded outputs are, from its arguments and its result.
OUTPUTS: dict[str, Callable[[tuple, object], list[torch.Tensor]]] = {
    "add_rms_norm_linear": lambda a, out: list(out),  # (projection, new residual)
    "silu_mul_linear": lambda a, out: [out],
    "add_rms_norm": lambda a, out: list(out),
    "linear": lambda a, out: [out],
    "head_linear": lambda a, out: [out],
    "mla_prepare_": lambda a, out: [a[0], _kv_rows(a[7], a[8])],  # q_pe rotated, the KV rows written
    "indexer_prepare": lambda a, out: [*out, _indexer_keys(a)],  # q8, weights, the keys written
    "indexer_logits_paged": _indexer_outputs,
    "topk_slots": lambda a, out: [out, out.sort(dim=-1).values],  # as they come, and as a set
    "sparse_mla": lambda a, out: list(out),  # (latent output, lse)
}
# The module whose global each call is (where the model looks it up): server.model.layers for
# these, server.model.attention for the rest.
LAYER_CALLS = ("add_rms_norm_linear", "silu_mul_linear", "add_rms_norm", "linear")
MODULES = {name: layers if name in LAYER_CALLS else attention for name in OUTPUTS}


@dataclass
class Call:
    step: int
    name: str
    occurrence: int  # of this name in the step (the layer, for calls made once per layer)
    outputs: list[torch.Tensor]


@dataclass
class Difference:
    call: Call  # its step, name and occurrence (its outputs are not kept)
    output: int  # which of the call's recorded outputs
    shape: tuple[int, ...]  # that output's
    rows: list[int]  # rows (first dim) that differ
    elements: int
    max_abs: float
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Recorder:
    """Records each wrapped call (reference run) or compares it with the reference's (later runs)."""

    reference: list[Call] | None = None
    calls: list[Call] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    step: int = 0
    batches: list[list[tuple[str, int]]] = field(default_factory=list)  # per step: (request, tokens)
    _counts: Counter[str] = field(default_factory=Counter)

    def start_step(self, batch: list[tuple[str, int]]) -> None:
        self.step = len(self.batches)
        self.batches.append(batch)
        self._counts.clear()

    def record(self, name: str, args: tuple, kwargs: dict, result: object) -> None:
        outputs = [t.detach().clone() if self.reference is None else t for t in OUTPUTS[name](args, result)]
        call = Call(self.step, name, self._counts[name], outputs)
        self._counts[name] += 1
        if self.reference is None:
            self.calls.append(call)
            return
        index = len(self.calls)
        self.calls.append(Call(call.step, name, call.occurrence, []))  # the reference holds the tensors
        ref = self.reference[index] if index < len(self.reference) else None
        if ref is None or (ref.step, ref.name, ref.occurrence) != (call.step, name, call.occurrence):
            raise RuntimeError(f"run schedules differ at call {index}: {name} in step {call.step}, "
                               f"reference {ref and (ref.name, ref.step)}")
        for i, (got, want) in enumerate(zip(outputs, ref.outputs)):
            diff = differing(got, want)
            if diff is not None:
                rows, elements, max_abs = diff
                # the first difference keeps a copy of its inputs, to run the call again alone
                kept = () if self.differences else tuple(a.clone() if isinstance(a, torch.Tensor) else a
                                                         for a in args)
                self.differences.append(Difference(self.calls[-1], i, tuple(got.shape), rows, elements, max_abs,
                                                   kept, kwargs))


def differing(got: torch.Tensor, want: torch.Tensor) -> tuple[list[int], int, float] | None:
    """(rows that differ, elements that differ, largest |difference|) of two tensors compared
    bit for bit, or None when they are identical."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return list(range(got.shape[0] if got.dim() else 1)), got.numel(), float("inf")
    a = got.contiguous().view(torch.uint8).reshape(got.numel(), -1) if got.numel() else got.reshape(0, 1)
    b = want.contiguous().view(torch.uint8).reshape(want.numel(), -1) if want.numel() else want.reshape(0, 1)
    bad = (a != b).any(dim=1).reshape(got.shape)
    elements = int(bad.sum())
    if not elements:
        return None
    rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().flatten().tolist() if got.dim() else [0]
    finite = bad & torch.isfinite(got.float()) & torch.isfinite(want.float())
    max_abs = float((got.float() - want.float()).abs()[finite].max()) if bool(finite.any()) else float("nan")
    return rows, elements, max_abs


@contextlib.contextmanager
def recording(recorder: Recorder, engine: Engine) -> Iterator[None]:
    """Wrap the model's kernel calls (module globals of server.model.attention and layers) and the
    runner's step entry for the recorder; restored on exit."""
    saved: list[tuple[object, str, object]] = []

    def wrap(module: object, name: str) -> None:
        fn = getattr(module, name)

        def recorded(*args, **kwargs):
            result = fn(*args, **kwargs)
            recorder.record(name, args, kwargs, result)
            return result

        saved.append((module, name, fn))
        setattr(module, name, recorded)

    for name, module in MODULES.items():
        wrap(module, name)
    execute = engine.runner.execute

    def stepped(batch, num_logits, *rest):
        recorder.start_step([(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        return execute(batch, num_logits, *rest)

    engine.runner.execute = stepped
    try:
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def run_once(args: argparse.Namespace, recorder: Recorder) -> dict[str, list[int]]:
    """One fresh eager engine over the check's requests; the greedy tokens of each request."""
    engine = check_engine(args, args.backend, args.kv_dtype, "eager", max_prompt=args.max_prompt)
    add_check_requests(engine, args.max_prompt)
    tokens: dict[str, list[int]] = {}
    with recording(recorder, engine):
        while engine.has_unfinished():
            for out in engine.step().outputs:
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def rows_owner(batch: list[tuple[str, int]], rows: list[int], num_rows: int) -> list[str]:
    """The requests that own the given rows of a [T, ...] tensor (T the step's tokens) or of a
    [requests, ...] one (the LM head's rows, one per request here); [] when the rows are neither."""
    if num_rows == sum(n for _, n in batch):
        owner = [r for r, n in batch for _ in range(n)]
    elif num_rows == len(batch):
        owner = [r for r, _ in batch]
    else:
        return []
    return sorted({owner[i] for i in rows})


def first_steps(recorder: Recorder) -> dict[str, int]:
    """Each request whose rows differ in some recorded output: the first step they do."""
    first: dict[str, int] = {}
    for d in recorder.differences:
        for request in rows_owner(recorder.batches[d.call.step], d.rows, d.shape[0] if d.shape else 0):
            first.setdefault(request, d.call.step)
    return first


def describe(d: Difference, batch: list[tuple[str, int]]) -> str:
    c = d.call
    owners = rows_owner(batch, d.rows, d.shape[0] if d.shape else 0)
    tokens = ", ".join(f"{r}:{n}" for r, n in batch)
    return (f"step {c.step} {c.name}#{c.occurrence} output {d.output} {d.shape}: {d.elements} elements in "
            f"{len(d.rows)} rows differ (max |diff| {d.max_abs:.3e}); rows of {owners}; batch [{tokens}]")


def repeat_alone(d: Difference, repeats: int) -> str:
    """Run the first differing call again on its own inputs: how many results differ from the first."""
    name = d.call.name
    if name in IN_PLACE or not d.args:
        return f"{name} writes into its inputs: not repeated alone"
    fn = getattr(MODULES[name], name)  # the kernel itself again, outside `recording`
    with torch.inference_mode():
        results = [OUTPUTS[name](d.args, fn(*d.args, **d.kwargs))[d.output].clone() for _ in range(repeats)]
    changed = sum(differing(r, results[0]) is not None for r in results[1:])
    shapes = [tuple(a.shape) for a in d.args if isinstance(a, torch.Tensor)]
    return f"{name} alone on the same inputs {shapes}: {changed} of {repeats - 1} repeats differ from the first"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reference = Recorder()
    first = run_once(args, reference)
    print(f"run 1: {len(reference.calls)} kernel calls recorded over {len(reference.batches)} steps", flush=True)
    for run in range(2, args.runs + 1):
        recorder = Recorder(reference=reference.calls)
        tokens = run_once(args, recorder)
        flips = [r for r in first if first[r] != tokens.get(r)]
        print(f"run {run}: greedy tokens {'DIFFER in ' + ','.join(flips) if flips else 'IDENTICAL'} to run 1; "
              f"{len(recorder.differences)} recorded outputs differ bitwise", flush=True)
        if recorder.differences:
            for d in recorder.differences[:args.show]:
                print("  " + describe(d, recorder.batches[d.call.step]), flush=True)
            print("  " + repeat_alone(recorder.differences[0], args.repeats), flush=True)
            steps = sorted({d.call.step for d in recorder.differences})
            print(f"  steps with differences: {steps}", flush=True)
            firsts = ", ".join(f"{r} from step {step}" for r, step in sorted(first_steps(recorder).items()))
            print(f"  requests whose rows differ: {firsts}", flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--backend", default="triton", choices=("triton", "torch"))
    p.add_argument("--kv-dtype", default="bf16", choices=("bf16", "fp8"))
    p.add_argument("--runs", type=int, default=3, help="eager runs; each after the first is compared with it")
    p.add_argument("--repeats", type=int, default=20, help="runs of the first differing call alone")
    p.add_argument("--show", type=int, default=12, help="differing outputs printed per run, in call order")
    p.add_argument("--max-prompt", type=int, default=None, help="cut the check's prompts to this many tokens")
    p.add_argument("--smoke", action="store_true", help="tiny model on CPU, torch kernels, short prompts")
    args = p.parse_args(argv)
    if args.runs < 2:
        p.error(f"--runs: at least 2 (a reference and a run to compare), got {args.runs}")
    if args.smoke:
        args.model, args.device, args.backend, args.max_prompt, args.runs = "tiny", "cpu", "torch", 120, 2
    return args


if __name__ == "__main__":
    sys.exit(main())
