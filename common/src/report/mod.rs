//! The `report` subcommand: gathers finished runs (each a `loss.tsv` plus the
//! `summary.json` that `train` writes) into `results/README.md` — a time table, a
//! loss-per-epoch table with a column per stage, the largest loss gap between stages —
//! and `results/loss.png`, the loss curves. `log` and `progress` are what a run reports
//! while it goes.

pub mod log;
mod plot;
pub mod progress;

pub use plot::{plot_table, Chart};

use crate::error::{Error, Result};
use crate::input::{read_text, MAX_LOSS_TABLE, MAX_RUN_NOTE};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What `train` records about a finished run, beside its loss table.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RunSummary {
    pub device: String,
    pub ranks: usize,
    pub params: usize,
    pub batch: usize,
    pub seq_len: usize,
    pub steps: u64,
    pub train_time_s: f64,
    pub train_tokens_per_s: f64,
    /// Of `train_time_s`, the seconds rank 0 waited for its next batch from the data loader
    /// (which prepares batches ahead on its own thread).
    #[serde(default)]
    pub loader_wait_s: f64,
    pub final_val_loss: f32,
    /// Tokens generated for the sample, and how long that took (inference time).
    pub sample_tokens: usize,
    pub sample_time_s: f64,
    /// The sample in printable form (`text::printable`), as `train` printed it.
    pub sample: String,
}

struct Run {
    label: String,
    rows: Vec<[f64; 5]>, // epoch, train_loss, val_loss, tokens_per_s, elapsed_s
    /// `None` for a run that has not finished (no `summary.json`).
    summary: Option<RunSummary>,
    /// Where it was measured: `DIR/env.txt`, as `results/describe-machine.sh` writes it.
    env: Option<String>,
}

/// `text` without a last line that has no newline after the header: a row whose write an
/// interruption cut short (a power cut mid-append; every row is written whole with its
/// newline), left out with a note rather than refused.
fn complete_lines<'t>(text: &'t str, path: &Path) -> &'t str {
    match text.rfind('\n') {
        Some(end) if end + 1 < text.len() => {
            eprintln!(
                "note: {}: its last line has no end (a write cut short): left out",
                path.display()
            );
            &text[..=end]
        }
        _ => text,
    }
}

fn read_run(spec: &str) -> Result<Run> {
    let Some((label, dir)) = spec
        .split_once('=')
        .filter(|(label, dir)| !label.is_empty() && !dir.is_empty())
    else {
        crate::bail_input!("--run takes LABEL=DIR, got '{spec}'");
    };
    let dir = Path::new(dir);
    let tsv = dir.join("loss.tsv");
    let text = read_text(&tsv, "a loss table", MAX_LOSS_TABLE, false)?;
    let text = complete_lines(&text, &tsv);
    // Columns by name: tables from before the bad_steps column read the same.
    let header: Vec<&str> = text.lines().next().unwrap_or("").split('\t').collect();
    let wanted = ["epoch", "train_loss", "val_loss", "tokens_per_s", "elapsed_s"];
    let Some(columns) = wanted
        .iter()
        .map(|w| header.iter().position(|h| h == w))
        .collect::<Option<Vec<_>>>()
    else {
        crate::bail_input!(
            "{}: the header must name the columns {}",
            tsv.display(),
            wanted.join(", ")
        );
    };
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let cells: Vec<&str> = line.split('\t').collect();
        let mut row = [0.0; 5];
        for (value, (&c, name)) in row.iter_mut().zip(columns.iter().zip(wanted)) {
            let Some(cell) = cells.get(c) else {
                crate::bail_input!("{}: line {} has fewer columns than its header", tsv.display(), i + 1);
            };
            // A diverged run writes NaN or inf: kept in the tables, left out of the plot.
            *value = cell.trim().parse().map_err(|_| {
                Error::Input(format!(
                    "{}: line {}: '{cell}' ({name}) is not a number",
                    tsv.display(),
                    i + 1
                ))
            })?;
        }
        rows.push(row);
    }
    if rows.is_empty() {
        crate::bail_input!("{}: no rows (did the run finish?)", tsv.display());
    }
    // `train` writes it at the end: a run stopped early (--stop-after, Ctrl-C), diverged or
    // still going has a table but no summary, and is marked as not finished.
    let sj = dir.join("summary.json");
    let summary = match sj.exists() {
        true => {
            let text = read_text(&sj, "a run summary", MAX_RUN_NOTE, false)?;
            Some(serde_json::from_str(&text).map_err(|e| Error::Input(format!("{}: {e}", sj.display())))?)
        }
        false => {
            eprintln!(
                "note: {} has no summary.json (the run stopped early, diverged or is still going): table 1 marks it as not finished",
                dir.display()
            );
            None
        }
    };
    let env = read_text(&dir.join("env.txt"), "a machine description", MAX_RUN_NOTE, false)
        .ok()
        .map(|s| s.trim().to_string());
    Ok(Run {
        label: label.to_string(),
        rows,
        summary,
        env,
    })
}

pub fn report(runs: &[String], out: &Path) -> Result<PathBuf> {
    let runs: Vec<Run> = runs.iter().map(|s| read_run(s)).collect::<Result<_>>()?;
    if let Some((i, r)) = runs
        .iter()
        .enumerate()
        .find(|(i, r)| runs[..*i].iter().any(|o| o.label == r.label))
    {
        crate::bail_input!(
            "--run: the label '{}' is given twice (run {}): each run needs its own",
            r.label,
            i + 1
        );
    }
    if runs.is_empty() {
        crate::bail_input!("give at least one --run LABEL=DIR");
    }
    crate::atomic_file::create_dir(out)?;
    let mut md = String::new();
    let _ = writeln!(md, "# Results\n");
    let model = match runs.iter().find_map(|r| r.summary.as_ref()) {
        Some(s) => format!(
            "Model: {} parameters, batch {}×{}, {} steps, same seed for every stage.",
            s.params, s.batch, s.seq_len, s.steps
        ),
        None => "No run has finished (none has `summary.json`).".to_string(),
    };
    let _ = writeln!(
        md,
        "Written by `make results` (the `report` subcommand) from the runs' own `loss.tsv` and `summary.json`. \
         {model}\n"
    );
    let _ = writeln!(
        md,
        "Where each run was measured (`results/describe-machine.sh` at run time):\n"
    );
    let _ = writeln!(md, "| stage | machine, software and commit |\n| --- | --- |");
    for r in &runs {
        let _ = writeln!(md, "| {} | {} |", r.label, r.env.as_deref().unwrap_or("not recorded"));
    }
    let _ = writeln!(md, "\n## Table 1: training and inference time\n");
    let _ = writeln!(md, "| stage | device | ranks | training time (s) | speed-up | train tokens/s | inference tokens/s | final val loss |");
    let _ = writeln!(md, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let base = runs[0].summary.as_ref().map_or(0.0, |s| s.train_time_s);
    for r in &runs {
        let Some(s) = &r.summary else {
            let _ = writeln!(
                md,
                "| {} | not finished (no summary.json) | – | – | – | – | – | – |",
                r.label
            );
            continue;
        };
        let infer = if s.sample_time_s > 0.0 {
            format!("{:.0}", s.sample_tokens as f64 / s.sample_time_s)
        } else {
            "–".into()
        };
        let speedup = if s.train_time_s > 0.0 && base > 0.0 {
            format!("{:.2}×", base / s.train_time_s)
        } else {
            "–".into()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.1} | {} | {:.0} | {} | {:.4} |",
            r.label, s.device, s.ranks, s.train_time_s, speedup, s.train_tokens_per_s, infer, s.final_val_loss
        );
    }
    let _ = writeln!(md, "\n## Table 2: loss per epoch (nats per token)\n");
    let mut head = String::from("| epoch |");
    let mut rule = String::from("| ---: |");
    for r in &runs {
        let _ = write!(head, " {0} train | {0} val |", r.label);
        rule.push_str(" ---: | ---: |");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    // Rows are matched by epoch (runs with the same settings evaluate at the same points).
    let key = |e: f64| format!("{e:.3}");
    let mut epochs: Vec<f64> = runs.iter().flat_map(|r| r.rows.iter().map(|x| x[0])).collect();
    epochs.sort_by(f64::total_cmp);
    epochs.dedup_by(|a, b| key(*a) == key(*b));
    let at = |r: &Run, e: f64| r.rows.iter().find(|x| key(x[0]) == key(e)).copied();
    for &e in &epochs {
        let _ = write!(md, "| {e:.3} |");
        for r in &runs {
            match at(r, e) {
                Some(row) => {
                    let _ = write!(md, " {:.4} | {:.4} |", row[1], row[2]);
                }
                None => md.push_str(" – | – |"),
            }
        }
        md.push('\n');
    }
    if runs.len() > 1 {
        let _ = writeln!(md, "\n## Agreement with {}\n", runs[0].label);
        let _ = writeln!(md, "Largest absolute difference over the rows both runs have, from the `loss.tsv` values (4 decimals: 0 means under 5e-5).\n");
        let _ = writeln!(md, "| stage | max \\|Δ train loss\\| | max \\|Δ val loss\\| |");
        let _ = writeln!(md, "| --- | ---: | ---: |");
        for r in &runs[1..] {
            let gap = |col: usize| {
                let pairs = r.rows.iter().filter_map(|a| Some((a, at(&runs[0], a[0])?)));
                pairs.map(|(a, b)| (a[col] - b[col]).abs()).fold(0.0f64, f64::max)
            };
            let _ = writeln!(md, "| {} | {:.2e} | {:.2e} |", r.label, gap(1), gap(2));
        }
        let _ = writeln!(
            md,
            "\nThe stages compute the same function, but sum each gradient in a different order (split \
             over ranks, or on a GPU), so the last bits differ; over hundreds of steps those \
             differences grow as training amplifies them. Over short runs they stay together: see \
             `make results`' 100-step runs in `results/short/`, and the tests (stage 1 within 1e-4 of \
             stage 0; stage 2 within 1e-3 of the CPU over 200 steps; stage 3 within 1e-3 of stage 2)."
        );
    }
    if let Some(s0) = runs[0].summary.as_ref().filter(|s| !s.sample.is_empty()) {
        let _ = writeln!(
            md,
            "\n## Sample from {}\n\n```text\n{}\n```",
            runs[0].label,
            s0.sample.trim()
        );
    }
    match plot(&runs, &out.join("loss.png")) {
        Ok(()) => {
            let _ = writeln!(md, "\n## Loss curves\n\n![loss per epoch](loss.png)");
        }
        Err(e) => eprintln!("warning: no plot: {e}"),
    }
    let path = out.join("README.md");
    crate::atomic_file::write(&path, |f| std::io::Write::write_all(f, md.as_bytes()))?;
    Ok(path)
}

/// The smallest and largest of `values` (f64::MAX, f64::MIN for none).
pub(crate) fn span(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)))
}

/// Refuses an axis from `lo` to `hi` that could not be drawn: one whose length is not a finite
/// number (values near f64's limits; plotters would never finish laying out its labels).
pub(crate) fn drawable(axis: &str, lo: f64, hi: f64) -> Result<()> {
    match (hi - lo).is_finite() {
        true => Ok(()),
        false => Err(Error::Input(format!(
            "the {axis} axis, {lo:e} to {hi:e}, is too long to draw"
        ))),
    }
}

/// A system font for the plot's text (Debian: fonts-dejavu-core).
fn load_font() -> Result<()> {
    const CANDIDATES: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    let bytes = CANDIDATES
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or_else(|| Error::Input("no DejaVuSans.ttf found (apt-get install fonts-dejavu-core)".into()))?;
    plotters::style::register_font(
        "sans-serif",
        plotters::style::FontStyle::Normal,
        Box::leak(bytes.into_boxed_slice()),
    )
    .map_err(|_| Error::Input("DejaVuSans.ttf is not a usable font".into()))
}

fn plot(runs: &[Run], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    load_font()?;
    let draw_err = |e: String| Error::Input(format!("{}: {e}", path.display()));
    // The points an axis can hold: finite epoch and loss.
    let points = |r: &Run, col: usize| -> Vec<(f64, f64)> {
        let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
        r.rows.iter().map(|x| (x[0], x[col])).filter(finite).collect()
    };
    let all: Vec<(f64, f64)> = runs
        .iter()
        .flat_map(|r| [points(r, 1), points(r, 2)])
        .flatten()
        .collect();
    if all.is_empty() {
        crate::bail_input!("no finite losses to plot");
    }
    let max_epoch = all.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-3);
    let (lo, hi) = span(all.iter().map(|p| p.1));
    drawable("epoch", 0.0, max_epoch * 1.02)?;
    drawable("loss", lo - 0.05, hi + 0.05)?;
    // Drawn into a temporary file beside it, then renamed over it: never a torn image.
    crate::atomic_file::write_by_path(path, |tmp| {
        let root = BitMapBackend::new(tmp, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("GPT-2 loss per epoch, by stage", ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..max_epoch * 1.02, (lo - 0.05)..(hi + 0.05))
            .map_err(|e| draw_err(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .y_desc("loss (nats/token)")
            .draw()
            .map_err(|e| draw_err(e.to_string()))?;
        for (i, r) in runs.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            for (col, name, width) in [(2, "val", 3), (1, "train", 1)] {
                let pts = points(r, col);
                chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(width)))
                    .map_err(|e| draw_err(e.to_string()))?
                    .label(format!("{} {name}", r.label))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width)));
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| draw_err(e.to_string()))?;
        root.present().map_err(|e| draw_err(e.to_string()))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_cut_short_is_left_out_and_a_whole_table_kept() {
        let p = Path::new("loss.tsv");
        let whole = "epoch\ttrain_loss\n0.1\t2.5\n0.2\t2.4\n";
        assert_eq!(complete_lines(whole, p), whole);
        assert_eq!(
            complete_lines("epoch\ttrain_loss\n0.1\t2.5\n0.2\t2.", p),
            "epoch\ttrain_loss\n0.1\t2.5\n"
        );
        // A header alone without its newline is left for the header check to judge.
        assert_eq!(complete_lines("epoch\ttrain", p), "epoch\ttrain");
    }
}
