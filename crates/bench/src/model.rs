//! The results of a run, as written to `results.json` and rendered into every other format.
//!
//! A run has [`Section`]s (one per profile part); a section has the [`Step`]s it measured (one fio
//! run each) and the [`Table`]s and [`PlotSpec`]s built from them. Renderers only read this model.

use crate::baseline::Baselines;
use crate::cpu::CpuUse;
use crate::env::Env;
use crate::fio::StepOutcome;
use crate::job::JobSpec;
use crate::parse::IoStats;
use serde::Serialize;

/// One fio run against one target.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Unique within the run; names the files `fio/<id>.{fio,json}`.
    pub id: String,
    pub section: String,
    /// The point within the section, e.g. `r70` or `qd16`.
    pub point: String,
    pub target: String,
    pub job: JobSpec,
    #[serde(flatten)]
    pub outcome: StepOutcome,
    pub cpu: Option<CpuUse>,
    /// Fraction of the raw limit that applies (None without a baseline).
    pub limit: Option<LimitUse>,
    pub wall_s: f64,
    pub attempts: u32,
    pub quiet_wait_s: f64,
    pub settle_wait_s: f64,
    pub warnings: Vec<String>,
    pub fio_json: String,
    pub fio_jobfile: String,
}

impl Step {
    pub fn stats(&self) -> Option<&IoStats> {
        self.outcome.stats()
    }
}

/// A result as a fraction of the raw limit it is bounded by.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitUse {
    /// e.g. `disk 4K random read (O_DIRECT)` or `network loopback`.
    pub name: String,
    pub unit: String,
    pub limit: f64,
    pub value: f64,
    pub fraction: f64,
}

/// A table cell: the text shown, the number behind it, and where it came from.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cell {
    pub text: String,
    pub value: Option<f64>,
    /// Step id the value came from (rendered as `data-step`), and which metric.
    pub step: Option<String>,
    pub metric: Option<String>,
    pub failed: bool,
    /// Tooltip / footnote, e.g. fio's error.
    pub note: Option<String>,
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        Cell {
            text: s.into(),
            ..Cell::default()
        }
    }
    pub fn num(text: String, value: f64, step: &str, metric: &str) -> Cell {
        Cell {
            text,
            value: Some(value),
            step: Some(step.into()),
            metric: Some(metric.into()),
            ..Cell::default()
        }
    }
    pub fn failed(step: &str, error: &str) -> Cell {
        Cell {
            text: "failed".into(),
            step: Some(step.into()),
            failed: true,
            note: Some(error.into()),
            ..Cell::default()
        }
    }
    pub fn na(why: &str) -> Cell {
        Cell {
            text: "-".into(),
            note: Some(why.into()),
            ..Cell::default()
        }
    }
}

/// A table with a caption that says what every number is.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    pub title: String,
    pub caption: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

/// One data series of a plot.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// How a plot is drawn.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PlotKind {
    /// Lines with markers; x may be log2-scaled.
    Line { log_x: bool },
    /// Grouped bars; x values are indexes into `categories`.
    Bar { categories: Vec<String> },
}

/// A plot: axes with units, a legend, optional horizontal reference lines.
#[derive(Debug, Clone, Serialize)]
pub struct PlotSpec {
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub kind: PlotKind,
    pub series: Vec<Series>,
    /// Horizontal lines such as a latency target: (y, label).
    pub hlines: Vec<(f64, String)>,
}

/// One part of a profile.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    pub id: String,
    pub title: String,
    /// How it was measured, in a sentence or two.
    pub method: String,
    /// The answers (knee, best IOPS under target, ...), one line each.
    pub findings: Vec<String>,
    pub tables: Vec<Table>,
    pub plots: Vec<PlotSpec>,
    pub steps: Vec<Step>,
}

impl Section {
    pub fn new(id: &str, title: &str, method: impl Into<String>) -> Section {
        Section {
            id: id.into(),
            title: title.into(),
            method: method.into(),
            findings: Vec::new(),
            tables: Vec::new(),
            plots: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// The step measured for `point` on `target`, if any.
    pub fn step(&self, point: &str, target: &str) -> Option<&Step> {
        self.steps
            .iter()
            .rev()
            .find(|s| s.point == point && s.target == target)
    }
}

/// Version of the `results.json` layout (docs/design/bench.md); bumped on incompatible change.
pub const FORMAT_VERSION: u32 = 1;

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Always [`FORMAT_VERSION`] when written by this version.
    pub format_version: u32,
    pub profile: String,
    pub command: String,
    pub started: String,
    pub duration_s: f64,
    pub env: Env,
    pub baselines: Option<Baselines>,
    pub sections: Vec<Section>,
    pub warnings: Vec<String>,
}

impl RunReport {
    pub fn all_steps(&self) -> impl Iterator<Item = &Step> {
        self.sections.iter().flat_map(|s| s.steps.iter())
    }
}
