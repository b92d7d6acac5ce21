//! The progress bars of long work (training, benchmarks, tokenizing): work done, time, and a
//! message. Like every indicatif bar they draw on standard error only where it is a terminal.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `total` steps starting at `at`; hidden where nothing should print (ranks
/// other than 0).
pub fn bar(visible: bool, total: u64, at: u64) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {elapsed_precise} < {eta_precise}  {msg}")
            .expect("static template"),
    );
    bar.set_position(at);
    bar
}

/// A bar over `total` bytes of input (`tokenize --output-dir`): bytes done, their rate, time.
pub fn bytes_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes}  {binary_bytes_per_sec}  {elapsed_precise} < {eta_precise}  {msg}",
        )
        .expect("static template"),
    );
    bar
}
