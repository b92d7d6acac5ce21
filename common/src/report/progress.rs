//! The progress bar of long work (training, benchmarks): steps done, time, and a message.

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
