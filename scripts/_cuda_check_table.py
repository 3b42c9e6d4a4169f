"""The one table of scripts/device-cuda-check, from the files its run wrote into OUT.

usage: python _cuda_check_table.py OUT GPU_MEMORY TARGET_NGL
Also writes OUT/cuda-check.json (every figure in the table plus the plan and llama.cpp's buffers).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gpu"))
from llama_log import parse_llama_log  # noqa: E402

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s+([0-9.]+) t/s")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


def llama_row(log: str) -> dict:
    m, d, a = _DECODED.search(log), _DRAFTED.search(log), _ACCEPT.search(log)
    if not m:
        return {"tokens_per_s": None}
    drafted, accepted = (int(d.group(1)) if d else 0), (int(a.group(1)) if a else 0)
    return {"tokens": int(m.group(1)), "tokens_per_s": float(m.group(3)),
            "acceptance_rate": accepted / drafted if drafted else None}


def main() -> None:
    out, gpu_mem, ngl = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    plan = json.loads((out / "plan.json").read_text())["plan"]
    bench = json.loads((out / "bench.json").read_text())
    rows: list[tuple[str, dict]] = []
    for mode in ("off", "draft"):
        stats = json.loads((out / f"es-{mode}.json").read_text())["stats"]
        rows.append((f"edgespec prompt --spec {mode}", stats))
    for mode, name in (("plain", "llama-speculative-simple (plain)"), ("draft", "llama-speculative-simple -md")):
        log = (out / f"lc-{mode}.log").read_text(errors="replace") + (out / f"lc-{mode}.out").read_text(errors="replace")
        rows.append((name, llama_row(log)))
    for mode, fig in bench["overall"].items():
        rows.append((f"edgespec bench {mode} (code prompts)", fig))
    base_es, base_lc = rows[0][1].get("tokens_per_s"), rows[2][1].get("tokens_per_s")

    t, d = plan["target"], plan["draft"]
    print()
    print(f"CUDA check: --gpu-memory {gpu_mem}; plan: target -ngl {t['n_gpu_layers']} "
          f"({', '.join(f'{k} {v / 2**20:.0f} MiB' for k, v in t['gpu_bytes'].items())}), "
          f"draft -ngl {d['n_gpu_layers']} ({', '.join(f'{k} {v / 2**20:.0f} MiB' for k, v in d['gpu_bytes'].items())}), "
          f"ctx {plan['n_ctx']}; llama-speculative-simple given -ngl {ngl} -ngld 99")
    print(f"{'run':44} {'tok/s':>8} {'vs plain':>9} {'accept':>7}")
    for name, fig in rows:
        tps = fig.get("tokens_per_s")
        base = base_lc if name.startswith("llama") else base_es
        ratio = fig.get("speedup") if "bench" in name else (tps / base if tps and base else None)
        acc = fig.get("acceptance_rate")
        print(f"{name:44} {tps if tps is not None else float('nan'):8.1f} "
              f"{(f'{ratio:.2f}x' if ratio else '-'):>9} {(f'{100 * acc:.0f}%' if acc is not None else '-'):>7}")
    buffers = parse_llama_log((out / "prompt-verbose.log").read_text(errors="replace"))
    print("llama.cpp's own view of the target (edgespec prompt --verbose):",
          "; ".join(f"{m.offloaded}/{m.n_units} layers offloaded, model buffers "
                    f"{ {k: round(v / 2**20) for k, v in m.model.items()} } MiB, KV "
                    f"{ {k: round(v / 2**20) for k, v in m.kv.items()} } MiB" for m in buffers[:1]))
    print("Weights are random (independent draws for target and draft), so acceptance is not meaningful;"
          " the timings are: same shapes and quantization as real Qwen2.5 7B / 0.5B models.")
    (out / "cuda-check.json").write_text(json.dumps({
        "gpu_memory": gpu_mem, "plan": plan, "rows": [{"run": n, **f} for n, f in rows],
        "llama_buffers": [m.to_json() for m in buffers],
    }, indent=1, default=str))


if __name__ == "__main__":
    main()
