//! The `plot` subcommand: line charts of a table (tab-separated, a header line naming the
//! columns) into a PNG, for the benchmark suite's tables (`results/bench-suite.sh`): one
//! line per y column and per value of the series column, points joined in the table's
//! order. Log axes plot log10 of the values with the values as labels.

use super::{drawable, load_font, span};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// What to draw: the table's columns, the axes, the files.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// The table: tab-separated, its first line naming the columns.
    pub data: PathBuf,
    /// The column along the x axis.
    pub x: String,
    /// The columns drawn against it.
    pub y: Vec<String>,
    /// A column whose values each get lines of their own (rows in the table's order).
    pub series: Option<String>,
    /// The PNG to write.
    pub out: PathBuf,
    pub log_x: bool,
    pub log_y: bool,
    pub title: Option<String>,
}

/// One line of the chart: its label and points.
type Line = (String, Vec<(f64, f64)>);

/// The lines the table holds for `args`' columns.
fn lines(text: &str, path: &Path, args: &Chart) -> Result<Vec<Line>> {
    let mut rows = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = rows.next().unwrap_or("").split('\t').collect();
    let col = |name: &str| {
        header.iter().position(|h| *h == name).ok_or_else(|| {
            Error::Input(format!(
                "{}: no column '{name}' (the header has: {})",
                path.display(),
                header.join(", ")
            ))
        })
    };
    let x = col(&args.x)?;
    let ys: Vec<(usize, &str)> = args
        .y
        .iter()
        .map(|y| Ok((col(y)?, y.as_str())))
        .collect::<Result<_>>()?;
    let series = args.series.as_deref().map(col).transpose()?;
    let mut out: Vec<Line> = Vec::new();
    for (i, row) in rows.enumerate() {
        let cells: Vec<&str> = row.split('\t').collect();
        let cell = |c: usize| cells.get(c).copied().unwrap_or("");
        let number = |c: usize| {
            let what = match cell(c).trim().parse::<f64>() {
                Ok(v) if v.is_finite() => return Ok(v),
                // An infinite value has no place on an axis (and made the axis endless).
                Ok(_) => "is not finite",
                Err(_) => "is not a number",
            };
            Err(Error::Input(format!(
                "{}: line {}: '{}' ({}) {what}",
                path.display(),
                i + 2,
                cell(c),
                header[c]
            )))
        };
        let xv = number(x)?;
        for &(yc, yname) in &ys {
            let label = match (series, ys.len()) {
                (Some(s), 1) => cell(s).to_string(),
                (Some(s), _) => format!("{} {yname}", cell(s)),
                (None, _) => yname.to_string(),
            };
            let point = (xv, number(yc)?);
            match out.iter_mut().find(|(l, _)| *l == label) {
                Some((_, pts)) => pts.push(point),
                None => out.push((label, vec![point])),
            }
        }
    }
    if out.is_empty() {
        crate::bail_input!("{}: no rows to plot", path.display());
    }
    Ok(out)
}

/// A value as an axis label: short, with a thousands suffix for large ones.
fn label(v: f64) -> String {
    let a = v.abs();
    match a {
        _ if a >= 1e9 => format!("{}G", trim(v / 1e9)),
        _ if a >= 1e6 => format!("{}M", trim(v / 1e6)),
        _ if a >= 1e4 => format!("{}K", trim(v / 1e3)),
        _ => trim(v),
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Draws `args`' chart into its PNG (written atomically).
pub fn plot_table(args: &Chart) -> Result<()> {
    use plotters::prelude::*;
    if !args.out.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")) || args.out.is_dir() {
        crate::bail_input!(
            "--out {}: the chart is a PNG: give a file path ending in .png",
            args.out.display()
        );
    }
    let text = crate::input::read_text(&args.data, "a table to plot", crate::input::MAX_PLOT_TABLE, true)?;
    let mut lines = lines(&text, &args.data, args)?;
    let (lx, ly) = (args.log_x, args.log_y);
    for (name, pts) in &mut lines {
        for p in pts.iter_mut() {
            if (lx && p.0 <= 0.0) || (ly && p.1 <= 0.0) {
                crate::bail_input!("{}: {name} has a value of 0 or less on a log axis", args.data.display());
            }
            *p = (if lx { p.0.log10() } else { p.0 }, if ly { p.1.log10() } else { p.1 });
        }
    }
    let all = || lines.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1) = span(all().map(|p| p.0));
    let (y0, y1) = span(all().map(|p| p.1));
    let pad = |a: f64, b: f64, log: bool| {
        let d = ((b - a) * 0.05).max(if log { 0.05 } else { 1e-9 });
        (if log { a - d } else { (a - d).min(0.0) }, b + d)
    };
    let ((x0, x1), (y0, y1)) = (pad(x0, x1, lx), pad(y0, y1, ly));
    let at = |e: Error| Error::Input(format!("{}: {e}", args.data.display()));
    drawable(&args.x, x0, x1).map_err(at)?;
    let y_name = args.y.join(", ");
    drawable(&y_name, y0, y1).map_err(at)?;
    load_font()?;
    let out = &args.out;
    let draw_err = |e: String| Error::Input(format!("{}: {e}", out.display()));
    // Drawn into a temporary file beside it, then renamed over it: never a torn image.
    crate::atomic_file::write_by_path(out, |tmp| {
        let root = BitMapBackend::new(tmp, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(args.title.as_deref().unwrap_or(""), ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| draw_err(e.to_string()))?;
        let unlog = |log: bool| move |v: &f64| label(if log { 10f64.powf(*v) } else { *v });
        let axis = |name: &str, log: bool| format!("{name}{}", if log { " (log scale)" } else { "" });
        // On a log axis, about one label a decade (plotters then picks whole powers of ten).
        let labels = |log: bool, a: f64, b: f64| if log { ((b - a).ceil() as usize + 1).max(2) } else { 10 };
        chart
            .configure_mesh()
            .x_labels(labels(lx, x0, x1))
            .y_labels(labels(ly, y0, y1))
            .x_desc(axis(&args.x, lx))
            .y_desc(axis(&y_name, ly))
            .x_label_formatter(&unlog(lx))
            .y_label_formatter(&unlog(ly))
            .draw()
            .map_err(|e| draw_err(e.to_string()))?;
        for (i, (name, pts)) in lines.into_iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| draw_err(e.to_string()))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| draw_err(e.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
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

    fn args(y: &[&str], series: Option<&str>) -> Chart {
        Chart {
            data: "t.tsv".into(),
            x: "threads".into(),
            y: y.iter().map(|s| s.to_string()).collect(),
            series: series.map(String::from),
            out: "t.png".into(),
            ..Chart::default()
        }
    }

    #[test]
    fn a_table_becomes_one_line_per_series_and_column() {
        let text = "threads\tspeedup\tideal\tstage\n1\t1.0\t1\ta\n2\t1.8\t2\ta\n1\t1.0\t1\tb\n";
        let one = lines(text, Path::new("t.tsv"), &args(&["speedup"], Some("stage"))).unwrap();
        assert_eq!(one.len(), 2);
        assert_eq!(one[0], ("a".to_string(), vec![(1.0, 1.0), (2.0, 1.8)]));
        let two = lines(text, Path::new("t.tsv"), &args(&["speedup", "ideal"], None)).unwrap();
        assert_eq!(two[1].0, "ideal");
        assert_eq!(two[1].1.len(), 3);
        let err = lines(text, Path::new("t.tsv"), &args(&["nope"], None)).unwrap_err();
        assert!(err.to_string().contains("no column 'nope'"), "{err}");
        assert_eq!(label(4_194_304.0), "4.19M");
        assert_eq!(label(2.5), "2.5");
    }
}
