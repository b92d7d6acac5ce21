//! Every GPU test in this folder holds `support::one_at_a_time()` from its first line: the GPU
//! tests of one process share the device's CUDA context, and one that opens a backend while
//! another records a CUDA graph fails. A new GPU test without the
//! lock fails here, on any machine, instead of now and then on a GPU.

use std::path::Path;

/// (file, test) of each `#[ignore = "needs a CUDA device"]` test whose body does not begin by
/// taking the lock.
fn tests_without_the_lock(dir: &Path) -> Vec<(String, String)> {
    let mut missing = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() != "#[ignore = \"needs a CUDA device\"]" {
                continue;
            }
            let Some(f) = (i + 1..lines.len()).find(|&j| lines[j].trim_start().starts_with("fn ")) else {
                continue;
            };
            let body = lines.get(f + 1).copied().unwrap_or("");
            if body.trim() != "let _gpu = support::one_at_a_time();" {
                let name = lines[f].trim_start().trim_start_matches("fn ");
                let name = name.split('(').next().unwrap_or(name).to_string();
                missing.push((file.file_name().unwrap().to_string_lossy().into_owned(), name));
            }
        }
    }
    missing
}

#[test]
fn every_gpu_test_takes_its_turn() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let missing = tests_without_the_lock(&dir);
    assert!(
        missing.is_empty(),
        "GPU tests that do not begin with `let _gpu = support::one_at_a_time();`: {missing:?}"
    );
}

#[test]
fn a_gpu_test_without_the_lock_is_found() {
    let dir = std::env::temp_dir().join(format!("gpu-turns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("a.rs"),
        "#[test]\n#[ignore = \"needs a CUDA device\"]\nfn holds() {\n    let _gpu = support::one_at_a_time();\n}\n\
         #[test]\n#[ignore = \"needs a CUDA device\"]\nfn forgets() {\n    let be = gpu();\n}\n",
    )
    .unwrap();
    let missing = tests_without_the_lock(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(missing, vec![("a.rs".to_string(), "forgets".to_string())]);
}
