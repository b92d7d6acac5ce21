//! Every flag of every subcommand against the values it must refuse.

use super::*;

/// Values each flag must refuse (both `--flag value` and `--flag=value`), by subcommand
/// and flag; an empty list marks a flag with nothing numeric to check (paths, names,
/// switches). Every flag of every subcommand must be listed: see the test below.
const BAD_VALUES: &[(&str, &str, &[&str])] = &[
    ("train", "data", &[]),
    ("train", "val_data", &[]),
    ("train", "out", &[]),
    ("train", "preset", &[]),
    ("train", "layers", &["0", "-1", "x"]),
    ("train", "heads", &["0", "1.5"]),
    ("train", "width", &["0"]),
    ("train", "max_seq_len", &["0"]),
    ("train", "tokenizer", &["bpe"]),
    ("train", "steps", &["0", "-3"]),
    ("train", "epochs", &["0", "-1", "nan", "inf"]),
    ("train", "batch", &["0", "4000000000000000000000"]),
    ("train", "seq_len", &["0"]),
    ("train", "lr", &["0", "-1", "nan", "inf", "1e99"]),
    ("train", "warmup", &["-1", "nan"]),
    ("train", "min_lr_frac", &["-0.1", "1.5", "nan"]),
    ("train", "weight_decay", &["-1", "nan"]),
    ("train", "grad_clip", &["-1", "nan", "inf"]),
    ("train", "seed", &["-1", "x"]),
    ("train", "eval_every", &["0"]),
    ("train", "eval_batches", &["0"]),
    ("train", "val_fraction", &["0", "1", "nan", "-0.5"]),
    ("train", "checkpoint_every", &["-1"]),
    ("train", "resume", &[]),
    ("train", "resume_on_new_data", &[]),
    ("train", "stop_after", &["0"]),
    ("train", "max_bad_steps", &["0"]),
    ("train", "comm_timeout", &["0", "-5", "x"]),
    ("train", "grad_accum", &["0", "-2"]),
    ("train", "recompute", &[]),
    ("train", "sample_len", &["1000001", "18446744073709551615"]),
    ("train", "threads", &["0", "100000"]),
    ("train", "precision", &["fp16"]),
    ("train", "overlap", &[]),
    ("train", "sync_every", &["0"]),
    ("train", "bucket_mb", &["0", "-1", "x"]),
    ("train", "zero", &["2", "3", "-1", "x"]),
    ("train", "grad_comm", &["fp16", "x"]),
    ("generate", "checkpoint", &[]),
    ("generate", "prompt", &[]),
    ("generate", "max_new_tokens", &["1000001", "18446744073709551615"]),
    ("generate", "greedy", &[]),
    ("generate", "temperature", &["0", "-1", "nan"]),
    ("generate", "top_k", &["-1"]),
    ("generate", "seed", &["-1"]),
    ("generate", "prompt_file", &[]),
    ("generate", "stop", &[]),
    ("generate", "top_p", &["0", "-0.5", "1.5", "nan"]),
    ("generate", "no_kv_cache", &[]),
    ("generate", "dump_logits", &[]),
    ("export", "checkpoint", &[]),
    ("export", "out", &[]),
    ("export", "format", &["onnx"]),
    ("import", "from", &[]),
    ("import", "out", &[]),
    ("train", "init_from", &[]),
    ("train", "dump_batches", &[]),
    ("train", "save_init", &[]),
    ("generate", "threads", &["0", "100000"]),
    ("generate", "precision", &["bf8"]),
    ("tokenize", "input", &[]),
    ("tokenize", "output", &[]),
    ("tokenize", "output_dir", &[]),
    ("tokenize", "shard_tokens", &["0", "-1", "x", "2147483648"]),
    ("tokenize", "val_tokens", &["-1", "1.5", "2147483648"]),
    ("tokenize", "prefix", &[]),
    ("tokenize", "threads", &["0", "100000"]),
    ("tokenize", "tokenizer", &["words"]),
    ("bench", "preset", &[]),
    ("bench", "layers", &["0"]),
    ("bench", "heads", &["0"]),
    ("bench", "width", &["0"]),
    ("bench", "max_seq_len", &["0"]),
    ("bench", "vocab", &["0"]),
    ("bench", "batch", &["0"]),
    ("bench", "seq_len", &["0"]),
    ("bench", "steps", &["0", "1000001", "18446744073709551615"]),
    ("bench", "warmup", &["-1", "1000001", "18446744073709551615"]),
    ("bench", "recompute", &[]),
    ("bench", "kernels", &[]),
    (
        "bench",
        "kernel_tokens",
        &["0", "-1", "x", "1048577", "4611686018427387904"],
    ),
    ("bench", "matmul_only", &[]),
    ("bench", "generate", &[]),
    ("bench", "new_tokens", &["0", "-1"]),
    ("bench", "threads", &["0", "100000"]),
    ("bench", "precision", &["fp64"]),
    ("bench", "overlap", &[]),
    ("bench", "sync_every", &["0"]),
    ("bench", "bucket_mb", &["0", "x"]),
    ("bench", "allreduce", &[]),
    ("bench", "allreduce_max_mb", &["0", "x"]),
    ("bench", "zero", &["2", "x"]),
    ("bench", "grad_comm", &["fp16"]),
    ("report", "runs", &[]),
    ("report", "out", &[]),
    ("plot", "data", &[]),
    ("plot", "x", &[]),
    ("plot", "y", &[]),
    ("plot", "series", &[]),
    ("plot", "out", &[]),
    ("plot", "log_x", &[]),
    ("plot", "log_y", &[]),
    ("plot", "title", &[]),
    ("mnist", "train_images", &[]),
    ("mnist", "train_labels", &[]),
    ("mnist", "test_images", &[]),
    ("mnist", "test_labels", &[]),
    ("mnist", "out", &[]),
    ("mnist", "resume", &[]),
    ("mnist", "stop_after", &["0", "-1", "x"]),
    ("mnist", "hidden", &["0", "x", "256,0", "-1", "1.5"]),
    ("mnist", "epochs", &["0", "-1", "1.5"]),
    ("mnist", "batch", &["0", "-4"]),
    ("mnist", "optimizer", &["adam", "lbfgs"]),
    ("mnist", "lr", &["0", "-1", "nan", "inf"]),
    ("mnist", "momentum", &["-0.1", "1.5", "nan"]),
    ("mnist", "weight_decay", &["-1", "nan"]),
    ("mnist", "seed", &["-1", "x"]),
    ("mnist", "synthetic", &[]),
    ("mnist", "trace", &[]),
    ("mnist", "bench", &[]),
    ("mnist", "sweep", &[]),
    ("mnist", "steps", &["0", "-1", "1000001", "10000000000"]),
    ("mnist", "warmup", &["-1", "x", "1000001", "18446744073709551615"]),
    ("mnist", "threads", &["0", "100000"]),
    ("mnist", "precision", &["fp16"]),
];

/// Arguments that make each subcommand parse, before the flag under test.
fn base(sub: &str) -> Vec<String> {
    let line = match sub {
        "train" => vec!["train", "--data", "d", "--out", "o"],
        "generate" => vec!["generate", "--checkpoint", "c"],
        "tokenize" => vec!["tokenize", "--input", "i", "--output", "o"],
        "export" => vec!["export", "--checkpoint", "c", "--out", "o"],
        "report" => vec!["report", "--run", "a=b"],
        _ => vec![sub],
    };
    line.into_iter().map(String::from).collect()
}

#[test]
fn every_flag_of_every_subcommand_is_in_the_table() {
    let cli = Cli::grammar();
    for sub in cli.get_subcommands() {
        for arg in sub.get_arguments().filter(|a| a.get_long().is_some()) {
            let (s, id) = (sub.get_name(), arg.get_id().as_str());
            if id == "help" || id == "version" {
                continue;
            }
            assert!(
                BAD_VALUES.iter().any(|&(ts, tid, _)| ts == s && tid == id),
                "{s} --{}: add it to BAD_VALUES",
                arg.get_long().unwrap()
            );
        }
    }
}

#[test]
fn every_bad_value_is_refused_in_both_forms() {
    let cli = Cli::grammar();
    for &(sub, id, values) in BAD_VALUES {
        let arg = cli
            .find_subcommand(sub)
            .and_then(|s| s.get_arguments().find(|a| a.get_id() == id))
            .unwrap_or_else(|| panic!("{sub} has no flag {id}"));
        let long = format!("--{}", arg.get_long().unwrap());
        for value in values {
            for form in [vec![long.clone(), value.to_string()], vec![format!("{long}={value}")]] {
                let mut line = vec!["stage".to_string()];
                line.extend(base(sub));
                line.extend(form.iter().cloned());
                let err = Cli::grammar().try_get_matches_from(&line).err();
                let err = err.unwrap_or_else(|| panic!("accepted: {line:?}"));
                let first = err.render().to_string();
                let first = first.lines().next().unwrap_or("");
                assert!(first.contains(&long), "{line:?}: the message must name {long}: {first}");
            }
        }
    }
}

/// A value each flag of `STAGE_FLAGS` and `CONFLICTS` accepts (switches take none).
fn good_value(id: &str) -> &'static str {
    match id {
        "threads" | "steps" | "epochs" | "top_k" => "2",
        "precision" => "fp32",
        "bucket_mb" => "25",
        "sync_every" => "4",
        "zero" => "1",
        "grad_comm" => "bf16",
        "comm_timeout" => "60",
        "temperature" => "0.5",
        "top_p" => "0.9",
        "val_fraction" => "0.1",
        _ => "some-path", // prompts, files and checkpoints: parsed as text
    }
}

/// The command line `stage <sub> <base> --a [v] --b [v]` for the first subcommand that has
/// every flag of `sides` (clap ids, or `id=value` as in [`CONFLICTS`]), and its matches.
fn line_with(sides: &[&str]) -> (Vec<String>, clap::ArgMatches) {
    let cli = Cli::grammar();
    let ids: Vec<&str> = sides.iter().map(|s| conflict_side(s).0).collect();
    let sub = cli
        .get_subcommands()
        .find(|s| ids.iter().all(|id| s.get_arguments().any(|a| a.get_id() == *id)))
        .unwrap_or_else(|| panic!("no subcommand has every flag of {ids:?}"));
    let mut line = vec!["stage".to_string()];
    line.extend(base(sub.get_name()));
    for side in sides {
        let (id, value) = conflict_side(side);
        let arg = sub.get_arguments().find(|a| a.get_id() == id).unwrap();
        line.push(format!("--{}", arg.get_long().unwrap()));
        if arg.get_action().takes_values() {
            line.push(value.unwrap_or(good_value(id)).to_string());
        }
    }
    let matches = Cli::grammar()
        .try_get_matches_from(&line)
        .unwrap_or_else(|e| panic!("{line:?} does not parse: {e}"));
    (line, matches)
}

const STAGES: [(StageKind, &str); 4] = [
    (
        StageKind {
            gpu: false,
            distributed: false,
        },
        "stage0_serial",
    ),
    (
        StageKind {
            gpu: false,
            distributed: true,
        },
        "stage1_mpi",
    ),
    (
        StageKind {
            gpu: true,
            distributed: false,
        },
        "stage2_cuda",
    ),
    (
        StageKind {
            gpu: true,
            distributed: true,
        },
        "stage3_mpi_cuda",
    ),
];

#[test]
fn every_stage_flag_is_refused_on_the_stages_it_does_not_apply_to() {
    for &(id, applies_to, applies) in STAGE_FLAGS {
        let (line, matches) = line_with(&[id]);
        for (stage, name) in STAGES {
            let checked = check_flags(&matches, stage, name);
            match applies(stage) {
                true => assert_eq!(checked, Ok(()), "{name} {line:?}"),
                false => {
                    let e = checked.expect_err(&format!("{name} accepted {line:?}"));
                    assert!(
                        e.starts_with(&flag_name(id)) && e.contains(applies_to) && e.contains(name),
                        "{e}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_conflicting_pair_is_refused_naming_both_flags() {
    for &(a, b, why) in CONFLICTS {
        // Each alone passes (on the stage where it applies), the two together do not.
        let (_, alone) = line_with(&[a]);
        let (line, both) = line_with(&[a, b]);
        // A stage both flags apply to (a flag outside STAGE_FLAGS applies to every stage).
        let applies = |stage: StageKind, side: &str| {
            let id = conflict_side(side).0;
            STAGE_FLAGS.iter().all(|&(f, _, applies)| f != id || applies(stage))
        };
        let stage = *STAGES
            .iter()
            .find(|s| applies(s.0, a) && applies(s.0, b))
            .unwrap_or_else(|| panic!("no stage takes both {a} and {b}"));
        assert_eq!(check_flags(&alone, stage.0, stage.1), Ok(()), "{a} alone");
        let e = check_flags(&both, stage.0, stage.1).expect_err(&format!("accepted {line:?}"));
        assert_eq!(
            e,
            format!("{} cannot be used with {}: {why}", conflict_name(a), conflict_name(b))
        );
    }
}

/// A pair refused at one value of a flag accepts the others: --zero 0 with local SGD is what
/// local SGD runs anyway.
#[test]
fn a_conflict_at_one_value_accepts_the_others() {
    let stage = STAGES[3];
    let (line, matches) = line_with(&["zero=0", "sync_every"]);
    assert_eq!(check_flags(&matches, stage.0, stage.1), Ok(()), "{line:?}");
}

#[test]
fn a_setting_whose_value_is_not_text_is_refused_not_ignored() {
    use super::checks::not_text_settings;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let var = |name: &str, value: &[u8]| (OsString::from(name), OsString::from_vec(value.to_vec()));
    assert_eq!(
        not_text_settings([var("GPT2_CUDA_GRAPH", b"0"), var("HOME", b"\xff")].into_iter()),
        Ok(())
    );
    for name in ["GPT2_CUDA_ATTENTION", "GPT2RS_FAIL_MODE"] {
        let err = not_text_settings([var("PATH", b"/bin"), var(name, b"fl\xffash")].into_iter()).unwrap_err();
        assert_eq!(err, format!("{name}=fl\u{fffd}ash: the value is not UTF-8 text"));
    }
}

#[test]
fn environment_switches_are_0_or_1_and_step_lists_are_numbers() {
    use super::checks::check_env_with;
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    };
    assert_eq!(check_env_with(env(&[])), Ok(()));
    assert_eq!(
        check_env_with(env(&[("GPT2_CUDA_GRAPH", "0"), ("GPT2_CUDA_ALLOC_LOG", "1")])),
        Ok(())
    );
    assert_eq!(check_env_with(env(&[("GPT2_GRAD_NORMS", "36, 37,")])), Ok(()));
    for (name, value) in [
        ("GPT2_CUDA_GRAPH", "false"),
        ("GPT2_MNIST_FUSED", "no"),
        ("GPT2_CUDA_ALLOC_LOG", "off"),
    ] {
        let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(name, value)]));
        let err = check_env_with(env(pairs)).unwrap_err();
        assert_eq!(err, format!("{name}={value}: give 0 (off) or 1 (on)"));
    }
    let err = check_env_with(env(&[("GPT2_GRAD_NORMS", "abc")])).unwrap_err();
    assert!(
        err.starts_with("GPT2_GRAD_NORMS=abc: give 0-based step numbers"),
        "{err}"
    );
}

/// `--zero`'s default follows the stage: ZeRO-1 on the GPU stage unless local SGD, off on
/// the CPU stage; what was typed is kept.
#[test]
fn zero_defaults_to_1_on_the_gpu_stage_only() {
    let stage = |gpu, distributed| StageKind { gpu, distributed };
    let settled = |sub: &str, extra: &[&str], kind: StageKind| -> bool {
        let mut line: Vec<String> = vec!["stage".into()];
        line.extend(base(sub));
        line.extend(extra.iter().map(|s| s.to_string()));
        let matches = Cli::grammar().try_get_matches_from(&line).expect("parses");
        let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).expect("parses");
        cli.settle_defaults(kind);
        match cli.command {
            Command::Train(a) => a.sync.zero(),
            Command::Bench(a) => a.sync.zero(),
            _ => unreachable!(),
        }
    };
    for sub in ["train", "bench"] {
        assert!(settled(sub, &[], stage(true, true)), "{sub}: stage 3");
        assert!(!settled(sub, &[], stage(false, true)), "{sub}: stage 1");
        assert!(!settled(sub, &[], stage(true, false)), "{sub}: stage 2");
        assert!(
            !settled(sub, &["--sync-every", "2"], stage(true, true)),
            "{sub}: local SGD"
        );
        assert!(!settled(sub, &["--zero", "0"], stage(true, true)), "{sub}: typed 0");
        assert!(settled(sub, &["--zero", "1"], stage(false, true)), "{sub}: typed 1");
    }
}

#[test]
fn a_whole_number_flag_says_what_is_wrong_with_a_value() {
    let cases = [
        ("-1", "must not be negative"),
        ("0.5", "must be a whole number"),
        ("1e300", "is too large"),
        ("18446744073709551616", "is too large"),
        ("inf", "is too large"),
        ("nan", "not a number"),
        ("x", "not a number"),
    ];
    for (value, why) in cases {
        // As typed, and as a resumed checkpoint's setting is checked.
        assert_eq!(
            refused_as_train_flag("comm_timeout", value).as_deref(),
            Some(why),
            "{value}"
        );
    }
    assert_eq!(refused_as_train_flag("comm_timeout", "60"), None);
}

#[test]
fn train_help_says_how_a_run_stops_and_resumes() {
    let mut cli = Cli::grammar();
    let train = cli.find_subcommand_mut("train").expect("train");
    let help = train.render_long_help().to_string();
    for what in ["Ctrl-C", "SIGTERM", "mpirun", "--resume OUT/model.ckpt", "SIGQUIT"] {
        assert!(help.contains(what), "train --help does not say {what:?}: {help}");
    }
}
