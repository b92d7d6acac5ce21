//! The stage 2 binary end to end on a GPU: `train` on a small corpus writes loss.tsv and a
//! checkpoint and learns, `generate` continues a prompt from that checkpoint, `bench` prints a
//! JSON line with the throughput and memory figures, and a bad input is one line, exit 2.
//! Needs a CUDA device: run with `--include-ignored` on a GPU machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary: $STAGE2_CUDA_BIN, else cargo's build of it, else `stage2_cuda` on PATH
/// (where a bundle built elsewhere puts it).
fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os("STAGE2_CUDA_BIN") {
        return PathBuf::from(p);
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_stage2_cuda"));
    if built.exists() {
        built
    } else {
        PathBuf::from("stage2_cuda")
    }
}

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().expect("stage2_cuda runs")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stage2-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn corpus(dir: &Path) -> PathBuf {
    let text = "ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n\n".repeat(40);
    let p = dir.join("corpus.txt");
    std::fs::write(&p, text).unwrap();
    p
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
#[ignore = "needs a CUDA device"]
fn train_then_generate_on_the_gpu() {
    let d = tmpdir("train");
    let data = corpus(&d);
    let out = d.join("run");
    let (data, out_s) = (data.to_str().unwrap(), out.to_str().unwrap());
    let args = [
        "train",
        "--data",
        data,
        "--out",
        out_s,
        "--model",
        "tiny",
        "--batch",
        "8",
        "--seq-len",
        "32",
        "--steps",
        "60",
        "--eval-every",
        "20",
        "--eval-batches",
        "2",
        "--sample-len",
        "20",
        "--precision",
        "fp32",
    ];
    let o = run(&args);
    assert!(o.status.success(), "train failed: {}", stderr(&o));
    let table = std::fs::read_to_string(out.join("loss.tsv")).unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split('\t').collect();
    let tokens_per_s = header
        .iter()
        .position(|h| *h == "tokens_per_s")
        .expect("a tokens_per_s column");
    let rows: Vec<Vec<f32>> = table
        .lines()
        .skip(1)
        .map(|l| l.split('\t').map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 3, "3 evaluation rows expected:\n{table}");
    assert!(rows[2][2] < rows[0][2], "validation loss should fall:\n{table}");
    assert!(
        rows.iter().all(|r| r[tokens_per_s] > 0.0),
        "tokens/s must be positive:\n{table}"
    );
    let ckpt = out.join("model.ckpt");
    assert!(ckpt.exists());

    let o = run(&[
        "generate",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "40",
        "--greedy",
    ]);
    assert!(o.status.success(), "generate failed: {}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("ROMEO:") && text.len() > 30, "{text}");
    // Greedy decoding is deterministic.
    let again = run(&[
        "generate",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "40",
        "--greedy",
    ]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), text);
}

#[test]
#[ignore = "needs a CUDA device"]
fn bench_prints_json_with_throughput_memory_and_mfu() {
    for precision in ["fp32", "tf32", "bf16"] {
        let o = run(&[
            "bench",
            "--model",
            "char",
            "--vocab",
            "256",
            "--batch",
            "8",
            "--seq-len",
            "128",
            "--steps",
            "5",
            "--precision",
            precision,
        ]);
        assert!(o.status.success(), "bench failed: {}", stderr(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        let report: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
        for key in ["tokens_per_s", "ms_per_step", "peak_device_mb"] {
            let x = report[key].as_f64().unwrap_or_else(|| panic!("{key} missing: {last}"));
            assert!(x > 0.0, "{key} = {x}");
        }
        let device = report["device"].as_str().unwrap_or_default();
        let hopper = device.contains("H100") || device.contains("H200");
        assert!(report.get("mfu").is_some(), "mfu missing: {last}");
        if hopper {
            let mfu = report["mfu"].as_f64().expect("mfu on a Hopper GPU");
            assert!(mfu > 0.0 && mfu < 1.0, "mfu {mfu}");
        }
    }
}

/// The checkpoint is read before the GPU is opened, so this runs anywhere.
#[test]
fn a_bad_input_is_one_line_and_exit_2() {
    let o = run(&["generate", "--checkpoint", "/nonexistent/model.ckpt"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A head size the flash kernels cannot run is refused in one line before training starts
/// (it was a device error at the first step), by train and by generate; the GEMM attention
/// path (f32 only) takes it.
#[test]
#[ignore = "needs a CUDA device"]
fn a_head_size_flash_attention_cannot_run_is_refused_up_front() {
    let d = tmpdir("head-size");
    let data = corpus(&d);
    let train = |out: &str, attention: &str| {
        let (data, out) = (data.to_str().unwrap(), d.join(out));
        let shape = "--layers 1 --heads 2 --width 512 --batch 2 --seq-len 16 --steps 2 --sample-len 0 --precision fp32";
        Command::new(bin())
            .args(["train", "--data", data, "--out", out.to_str().unwrap()])
            .args(shape.split(' '))
            .env("GPT2_CUDA_ATTENTION", attention)
            .output()
            .unwrap()
    };
    let o = train("flash", "flash");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("flash attention runs head sizes up to 128 (--width / --heads), not 256"),
        "{err}"
    );
    let o = train("gemm", "gemm");
    assert!(o.status.success(), "{}", stderr(&o));
    // generate refuses that checkpoint's heads under flash attention the same way.
    let ckpt = d.join("gemm/model.ckpt");
    let o = Command::new(bin())
        .args([
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--max-new-tokens",
            "4",
        ])
        .env("GPT2_CUDA_ATTENTION", "flash")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("flash attention runs head sizes up to 128"), "{err}");
}

/// Flags of other stages are refused at parse time, before any GPU is opened: these run
/// anywhere (`cli::STAGE_FLAGS`).
#[test]
fn cpu_and_multi_process_flags_are_refused() {
    let d = tmpdir("refused");
    let data = corpus(&d);
    let data = data.to_str().unwrap();
    for (extra, needle) in [
        (&["--threads", "2"][..], "--threads applies to the CPU stages"),
        (&["--overlap"][..], "--overlap applies to the multi-process stages"),
        (&["--zero", "1"][..], "--zero applies to the multi-process stages"),
        (
            &["--sync-every", "2"][..],
            "--sync-every applies to the multi-process stages",
        ),
    ] {
        let mut args = vec!["train", "--data", data, "--out", "/nonexistent/out"];
        args.extend_from_slice(extra);
        let o = run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

/// `loss.tsv` without the two time columns, and the final checkpoint's arrays (parameters
/// and AdamW moments; its header holds the run's times).
fn run_state(dir: &Path) -> (Vec<String>, Vec<u8>) {
    let text = std::fs::read_to_string(dir.join("loss.tsv")).unwrap();
    let table = text
        .lines()
        .map(|l| l.split('\t').take(4).collect::<Vec<_>>().join("\t"))
        .collect();
    let bytes = std::fs::read(dir.join("model.ckpt")).unwrap();
    let meta = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    (table, bytes[24 + meta + 8..bytes.len() - 8].to_vec())
}

/// A small run past the warmup on the GPU in `precision`, into `out`, with `extra` flags;
/// what it printed.
fn gpu_run(data: &Path, out: &Path, precision: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "train",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(&["--model", "tiny", "--batch", "8", "--seq-len", "32", "--warmup", "5"]);
    args.extend_from_slice(&[
        "--eval-every",
        "10",
        "--eval-batches",
        "2",
        "--sample-len",
        "0",
        "--precision",
        precision,
    ]);
    args.extend_from_slice(extra);
    let o = Command::new(bin()).args(&args).output().expect("stage2_cuda runs");
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
#[ignore = "needs a CUDA device"]
fn same_seed_runs_are_identical_on_the_gpu() {
    let d = tmpdir("deterministic");
    let data = corpus(&d);
    for precision in ["fp32", "tf32", "bf16"] {
        let (a, b) = (d.join(format!("{precision}-a")), d.join(format!("{precision}-b")));
        gpu_run(&data, &a, precision, &["--steps", "40"]);
        gpu_run(&data, &b, precision, &["--steps", "40"]);
        assert!(run_state(&a) == run_state(&b), "{precision}: two same-seed runs differ");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_stopped_and_resumed_gpu_run_is_the_same_run() {
    let d = tmpdir("resume");
    let data = corpus(&d);
    for precision in ["fp32", "tf32", "bf16"] {
        let (straight, cut) = (
            d.join(format!("{precision}-straight")),
            d.join(format!("{precision}-cut")),
        );
        gpu_run(&data, &straight, precision, &["--steps", "40"]);
        gpu_run(&data, &cut, precision, &["--steps", "40", "--stop-after", "17"]);
        let ckpt = cut.join("model.ckpt");
        gpu_run(&data, &cut, precision, &["--resume", ckpt.to_str().unwrap()]);
        assert!(
            run_state(&straight) == run_state(&cut),
            "{precision}: the resumed run differs"
        );
    }
}

/// Checkpoints copied within the GPU and brought to host memory by the writer's thread while
/// the steps go on: a save every 5 steps, each written while the next steps run (the next save
/// reusing the copy's memory), and the last at `--stop-after`; resumed from that last one, the
/// run ends where a run without saves ends.
#[test]
#[ignore = "needs a CUDA device"]
fn checkpoints_copied_within_the_gpu_resume_to_the_same_run() {
    let d = tmpdir("snapshot");
    let data = corpus(&d);
    for precision in ["fp32", "bf16"] {
        let (straight, saved) = (
            d.join(format!("{precision}-straight")),
            d.join(format!("{precision}-saved")),
        );
        gpu_run(&data, &straight, precision, &["--steps", "40"]);
        let flags = ["--steps", "40", "--checkpoint-every", "5", "--stop-after", "23"];
        let printed = gpu_run(&data, &saved, precision, &flags);
        let saves: Vec<&str> = printed.lines().filter(|l| l.starts_with("checkpoint: step")).collect();
        println!("SNAPSHOT {precision}: {saves:#?}");
        assert_eq!(saves.len(), 5, "saves at steps 5, 10, 15, 20, 23: {printed}");
        assert!(saves.iter().all(|l| l.contains("copying on the device")), "{printed}");
        let ckpt = saved.join("model.ckpt");
        gpu_run(&data, &saved, precision, &["--resume", ckpt.to_str().unwrap()]);
        assert!(
            run_state(&straight) == run_state(&saved),
            "{precision}: the run resumed from a copy on the device differs"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_bf16_checkpoint_resumes_in_tf32_and_says_so() {
    // Master weights and moments are fp32 in every precision, so the state carries over whole.
    let d = tmpdir("resume-precision");
    let data = corpus(&d);
    let out = d.join("run");
    gpu_run(&data, &out, "bf16", &["--steps", "30", "--stop-after", "12"]);
    let ckpt = out.join("model.ckpt");
    let args = [
        "train",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--resume",
        ckpt.to_str().unwrap(),
        "--precision",
        "tf32",
        "--sample-len",
        "0",
    ];
    let o = run(&args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("trained in bf16 and resumes in tf32"), "{err}");
    let rows = std::fs::read_to_string(out.join("loss.tsv")).unwrap();
    assert!(rows.lines().count() > 2, "the resumed run goes on logging: {rows}");
    // And sampling in bf16 (the logits come back from bf16 memory): deterministic when greedy.
    let generate = || {
        let o = run(&[
            "generate",
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "20",
            "--greedy",
            "--precision",
            "bf16",
        ]);
        assert!(o.status.success(), "generate failed: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let text = generate();
    assert!(text.starts_with("ROMEO:") && text.len() > 20, "{text}");
    assert_eq!(generate(), text);
}

#[test]
#[ignore = "needs a CUDA device"]
fn recompute_is_the_same_run_on_the_gpu() {
    // --recompute computes layernorm and GELU outputs again with the forward's kernels: in
    // fp32 and tf32 (GELU in our kernel), the same run bit for bit. In bf16 the forward's GELU
    // output comes from cuBLASLt's epilogue and the recomputed one from `gelu_forward`, which
    // may round it otherwise: only the MLP's second weight gradient sees the difference, so
    // the losses agree to 1% (a sanity bound: a wrong recomputation, e.g. another layer's
    // values, moves them further), not bit for bit.
    let d = tmpdir("recompute");
    let data = corpus(&d);
    for precision in ["fp32", "tf32", "bf16"] {
        let (kept, again) = (
            d.join(format!("{precision}-kept")),
            d.join(format!("{precision}-again")),
        );
        gpu_run(&data, &kept, precision, &["--steps", "40"]);
        gpu_run(&data, &again, precision, &["--steps", "40", "--recompute"]);
        let (kept, again) = (run_state(&kept), run_state(&again));
        if precision != "bf16" {
            assert!(kept == again, "{precision}: --recompute changed the run");
            continue;
        }
        assert_eq!(kept.0.len(), again.0.len(), "{precision}: as many loss rows");
        for (a, b) in kept.0.iter().zip(&again.0).skip(1) {
            let (a, b): (Vec<&str>, Vec<&str>) = (a.split('\t').collect(), b.split('\t').collect());
            for col in [1, 2] {
                let (x, y): (f32, f32) = (a[col].parse().unwrap(), b[col].parse().unwrap());
                let rel = (x - y).abs() / x.abs();
                eprintln!("RECOMPUTE {precision} column {col}: {x} vs {y} ({rel:.2e})");
                assert!(rel <= 1e-2, "{precision}: --recompute moved a loss {x} -> {y}");
            }
        }
    }
}

/// Another stage's binary: next to this one (cargo builds every workspace binary), or on PATH.
fn sibling(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_stage2_cuda")).with_file_name(name);
    if p.exists() {
        p
    } else {
        PathBuf::from(name)
    }
}

/// loss.tsv's (train, val) columns.
fn losses(dir: &Path) -> Vec<(f32, f32)> {
    let text = std::fs::read_to_string(dir.join("loss.tsv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let c: Vec<f32> = l.split('\t').map(|x| x.parse().unwrap()).collect();
            (c[1], c[2])
        })
        .collect()
}

/// A checkpoint written on the GPU resumes on the CPU (stage 0) and one written on the CPU
/// resumes on the GPU: each continued run ends where the straight runs do (GPU fp32 and CPU
/// agree to 1e-3 over the run), its table whole.
#[test]
#[ignore = "needs a CUDA device"]
fn a_checkpoint_moves_between_the_gpu_and_the_cpu() {
    let d = tmpdir("cross-stage");
    let data = corpus(&d);
    let cpu_run = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(&["--model", "tiny", "--batch", "8", "--seq-len", "32", "--warmup", "5"]);
        args.extend_from_slice(&["--eval-every", "10", "--eval-batches", "2", "--sample-len", "0"]);
        args.extend_from_slice(extra);
        let o = Command::new(sibling("stage0_serial"))
            .args(&args)
            .output()
            .expect("stage0_serial runs");
        assert!(o.status.success(), "stage0 {args:?}: {}", stderr(&o));
    };
    let (gpu, cpu) = (d.join("gpu"), d.join("cpu"));
    gpu_run(&data, &gpu, "fp32", &["--steps", "40"]);
    cpu_run(&cpu, &["--steps", "40"]);
    let (gpu_to_cpu, cpu_to_gpu) = (d.join("gpu-to-cpu"), d.join("cpu-to-gpu"));
    gpu_run(&data, &gpu_to_cpu, "fp32", &["--steps", "40", "--stop-after", "17"]);
    let ckpt = gpu_to_cpu.join("model.ckpt");
    cpu_run(&gpu_to_cpu, &["--resume", ckpt.to_str().unwrap()]);
    cpu_run(&cpu_to_gpu, &["--steps", "40", "--stop-after", "17"]);
    let ckpt = cpu_to_gpu.join("model.ckpt");
    gpu_run(&data, &cpu_to_gpu, "fp32", &["--resume", ckpt.to_str().unwrap()]);
    let want = losses(&gpu);
    assert_eq!(want.len(), 4, "rows at steps 10, 20, 30, 40");
    for (name, dir) in [("cpu", &cpu), ("gpu -> cpu", &gpu_to_cpu), ("cpu -> gpu", &cpu_to_gpu)] {
        let got = losses(dir);
        assert_eq!(got.len(), want.len(), "{name}: {got:?}");
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g.0 - w.0).abs() <= 1e-3 && (g.1 - w.1).abs() <= 1e-3,
                "{name}: {got:?} against the GPU's {want:?}"
            );
        }
        println!("CROSS {name}: {got:?} (GPU straight {want:?})");
    }
}

/// `mnist` on the GPU (the fused step: data on the device, one graph replay a step, in bf16),
/// stopped mid-epoch by --stop-after and resumed: the table and the checkpoint's arrays of the
/// run never stopped.
#[test]
#[ignore = "needs a CUDA device"]
fn a_stopped_and_resumed_mnist_run_is_the_same_run_on_the_gpu() {
    let d = tmpdir("mnist-resume");
    let mnist = |out: &Path, extra: &[&str]| {
        let flags = [
            "mnist",
            "--synthetic",
            "--hidden",
            "64,32",
            "--batch",
            "500",
            "--epochs",
            "3",
        ];
        let o = Command::new(bin())
            .args(flags)
            .arg("--out")
            .arg(out)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let state = |out: &Path| {
        let path = out.join("mlp.ckpt");
        let ck = common::mnist::checkpoint::parse(&std::fs::read(&path).unwrap(), &path).unwrap();
        let table: Vec<String> = std::fs::read_to_string(out.join("loss.tsv"))
            .unwrap()
            .lines()
            .map(|l| l.split('\t').take(4).collect::<Vec<_>>().join("\t"))
            .collect();
        (table, ck.meta.step, ck.params, ck.state)
    };
    let (straight, stopped) = (d.join("straight"), d.join("stopped"));
    assert!(mnist(&straight, &[]).contains("one graph replay a step"));
    // 120 steps an epoch: step 200 is mid-way through the second.
    assert!(mnist(&stopped, &["--stop-after", "200"]).contains("stopped after step 200"));
    let ckpt = stopped.join("mlp.ckpt");
    mnist(&stopped, &["--resume", ckpt.to_str().unwrap()]);
    assert_eq!(state(&stopped), state(&straight));
}
