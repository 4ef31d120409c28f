//! `gatehouse bench detector`: recall, irrelevant planning and latency of the detector on a tool
//! catalog and labelled messages in JSON lines (see `scripts/bfcl-detector-data`).
//!
//! catalog:    {"name", "description", "input_schema"}
//! queries:    {"id", "message", "expect": [tool names]}
//! irrelevant: {"id", "message"}
//!
//! The tools go through the same [`Index::build`] as the server's; every message is detected as
//! the owner in a direct chat, with no recent context.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::Deserialize;

use server::lane::detector::{ChatKind, DetectorSettings, Index, ParamDoc, Role, ToolDoc};

#[derive(Debug, clap::Args)]
pub struct DetectorBench {
    /// Tools, one JSON object a line: {"name", "description", "input_schema"}.
    #[arg(long)]
    pub catalog: PathBuf,
    /// Labelled messages: {"id", "message", "expect": [tool names]}.
    #[arg(long)]
    pub queries: PathBuf,
    /// Messages no tool should answer: {"id", "message"}.
    #[arg(long)]
    pub irrelevant: Option<PathBuf>,
    /// Also print each labelled message whose expected tools are not all in its top ten, with
    /// the ten it got, to stderr (for tuning the detector).
    #[arg(long)]
    pub misses: bool,
    /// Detector settings to measure instead of the shipped ones: a TOML file of
    /// `[lane.detector]` keys (at its top level), for tuning before changing gatehouse.toml.
    /// The shipped ones read the word vectors at `data/detector/word-vectors.bin` (made by
    /// scripts/build) when they are there; `vectors = ""` measures the lexical detector alone.
    #[arg(long)]
    pub settings: Option<PathBuf>,
}

/// `gatehouse bench detector`, with the shipped detector settings.
pub fn command(args: &DetectorBench) -> Result<(), BenchError> {
    let settings = match &args.settings {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| BenchError::Read { path: path.clone(), source })?;
            toml::from_str(&text).map_err(|e| BenchError::Settings { path: path.clone(), message: e.to_string() })?
        }
        None => DetectorSettings::default(),
    };
    let report = run(&args.catalog, &args.queries, args.irrelevant.as_deref(), settings, args.misses)?;
    print!("{report}");
    // The context of the six figures, apart from them so the figures stay one a line.
    eprintln!(
        "{} tools indexed in {:.1} ms ({}); {} queries ({:.1}% would be planned); {} irrelevant messages",
        report.tools,
        report.build.as_secs_f64() * 1000.0,
        if report.vectors { "with word vectors" } else { "lexical only" },
        report.queries,
        report.queries_planned,
        report.irrelevant
    );
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid detector settings: {message}")]
    Settings { path: PathBuf, message: String },
    #[error("{path} line {line}: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}: no entries")]
    Empty { path: PathBuf },
}

/// The figures of one run. `Display` prints the six lines the command shows.
#[derive(Debug, Clone)]
pub struct Report {
    pub tools: usize,
    /// Whether the word vectors took part in the ranking.
    pub vectors: bool,
    pub queries: usize,
    pub recall_at_1: f64,
    pub recall_at_5: f64,
    pub recall_at_10: f64,
    /// Share of the labelled queries that would be planned (not printed; for tuning).
    pub queries_planned: f64,
    pub irrelevant: usize,
    pub irrelevant_planned: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub build: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        writeln!(f, "recall@1 {:.1}%", self.recall_at_1)?;
        writeln!(f, "recall@5 {:.1}%", self.recall_at_5)?;
        writeln!(f, "recall@10 {:.1}%", self.recall_at_10)?;
        writeln!(f, "irrelevant planned {:.1}%", self.irrelevant_planned)?;
        writeln!(f, "p50 {:.3} ms", ms(self.p50))?;
        writeln!(f, "p99 {:.3} ms", ms(self.p99))
    }
}

#[derive(Deserialize)]
struct CatalogLine {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    input_schema: serde_json::Value,
}

#[derive(Deserialize)]
struct QueryLine {
    #[serde(rename = "id")]
    _id: serde_json::Value,
    message: String,
    #[serde(default)]
    expect: Vec<String>,
}

fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value = serde_json::from_str(line).map_err(|source| BenchError::Parse {
            path: path.to_owned(),
            line: i + 1,
            source,
        })?;
        out.push(value);
    }
    if out.is_empty() {
        return Err(BenchError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(out)
}

/// Reads a catalog file into tool docs, as an MCP or connector catalog would give them.
pub fn load_catalog(path: &Path) -> Result<Vec<ToolDoc>, BenchError> {
    Ok(read_lines::<CatalogLine>(path)?
        .into_iter()
        .map(|line| ToolDoc {
            params: ParamDoc::from_schema(&line.input_schema),
            name: line.name,
            description: line.description,
            ..ToolDoc::default()
        })
        .collect())
}

/// Runs the benchmark. `settings.max_candidates` is raised to 10 (recall@10 needs ten ranks) and
/// the candidate cut-off is lifted; the plan decision is the configured one.
pub fn run(
    catalog: &Path,
    queries: &Path,
    irrelevant: Option<&Path>,
    settings: DetectorSettings,
    show_misses: bool,
) -> Result<Report, BenchError> {
    let docs = load_catalog(catalog)?;
    let queries: Vec<QueryLine> = read_lines(queries)?;
    let irrelevant: Vec<QueryLine> = match irrelevant {
        Some(path) => read_lines(path)?,
        None => Vec::new(),
    };
    let settings = DetectorSettings {
        max_candidates: settings.max_candidates.max(10),
        candidate_ratio: 0.0,
        ..settings
    };

    // The build time counts the index, not reading the word-vector table (done once per process).
    let vectors = server::lane::detector::WordVectors::shared(&settings.vectors);
    let started = Instant::now();
    let index = Index::build_with(docs, settings, vectors);
    let build = started.elapsed();

    // One untimed pass first, so that the timings do not count first-touch page faults.
    for message in queries.iter().chain(&irrelevant) {
        std::hint::black_box(index.detect(&message.message, Role::Owner, ChatKind::Direct, &[]));
    }
    let mut times = Vec::with_capacity(queries.len() + irrelevant.len());
    // Detects one message as an owner in a direct chat, timing it.
    let mut timed = |message: &str| {
        let started = Instant::now();
        let detection = index.detect(message, Role::Owner, ChatKind::Direct, &[]);
        times.push(started.elapsed());
        detection
    };
    let mut found = [0usize; 3];
    let mut planned = 0usize;
    for query in &queries {
        let detection = timed(&query.message);
        planned += usize::from(detection.should_plan);
        for (slot, k) in [1, 5, 10].into_iter().enumerate() {
            let top: Vec<&str> = detection
                .candidates
                .iter()
                .take(k)
                .map(|c| c.name.as_str())
                .collect();
            if !query.expect.is_empty() && query.expect.iter().all(|e| top.contains(&e.as_str())) {
                found[slot] += 1;
            } else if k == 10 && show_misses {
                eprintln!("miss\t{}\texpected {:?}\tgot {:?}", query.message.chars().take(160).collect::<String>(), query.expect, top);
            }
        }
    }
    let mut irrelevant_planned = 0usize;
    for message in &irrelevant {
        irrelevant_planned += usize::from(timed(&message.message).should_plan);
    }
    times.sort_unstable();
    let percent = |n: usize, of: usize| {
        if of == 0 {
            0.0
        } else {
            100.0 * n as f64 / of as f64
        }
    };
    let quantile = |q: f64| {
        times
            .get(((times.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    Ok(Report {
        tools: index.len(),
        vectors: index.has_vectors(),
        queries: queries.len(),
        recall_at_1: percent(found[0], queries.len()),
        recall_at_5: percent(found[1], queries.len()),
        recall_at_10: percent(found[2], queries.len()),
        queries_planned: percent(planned, queries.len()),
        irrelevant: irrelevant.len(),
        irrelevant_planned: percent(irrelevant_planned, irrelevant.len()),
        p50: quantile(0.50),
        p99: quantile(0.99),
        build,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_bench_reads_json_lines_and_prints_six_figures() {
        let dir = tempfile::tempdir().expect("temp dir");
        let catalog = dir.path().join("catalog.jsonl");
        let queries = dir.path().join("queries.jsonl");
        let irrelevant = dir.path().join("irrelevant.jsonl");
        let tool = |name: &str, description: &str, param: &str| {
            json!({ "name": name, "description": description, "input_schema": { "type": "object", "properties": { param: { "type": "string" } } } }).to_string()
        };
        let lines = [
            tool(
                "get_weather_forecast",
                "Weather forecast for a city for the next days.",
                "city",
            ),
            tool(
                "convert_currency",
                "Converts an amount of money from one currency to another.",
                "amount",
            ),
            tool(
                "calculate_triangle_area",
                "Area of a triangle from its base and height.",
                "base",
            ),
        ];
        std::fs::write(&catalog, lines.join("\n")).expect("write catalog");
        std::fs::write(
            &queries,
            [
                json!({ "id": "q1", "message": "What is the weather forecast for Paris?", "expect": ["get_weather_forecast"] }),
                json!({ "id": "q2", "message": "Convert 10 euros to another currency", "expect": ["convert_currency"] }),
            ]
            .map(|v| v.to_string())
            .join("\n"),
        )
        .expect("write queries");
        std::fs::write(
            &irrelevant,
            json!({ "id": "i1", "message": "Thanks!" }).to_string(),
        )
        .expect("write irrelevant");
        let report = run(
            &catalog,
            &queries,
            Some(&irrelevant),
            DetectorSettings::default(),
            false,
        )
        .expect("bench runs");
        assert_eq!(report.tools, 3);
        assert_eq!(report.recall_at_1, 100.0);
        assert_eq!(report.irrelevant_planned, 0.0);
        let printed = report.to_string();
        let lines: Vec<&str> = printed.lines().collect();
        assert_eq!(lines.len(), 6, "{printed}");
        for (line, prefix) in lines.iter().zip([
            "recall@1 ",
            "recall@5 ",
            "recall@10 ",
            "irrelevant planned ",
            "p50 ",
            "p99 ",
        ]) {
            assert!(line.starts_with(prefix), "{line}");
        }
        assert!(lines[0].ends_with('%') && lines[5].ends_with(" ms"));
    }
}
