//! One command, several targets, optionally a `--find-max` sweep each: runs a
//! scenario against every target (starting and stopping the ones it manages,
//! a fresh server for every point), and writes per-point results, a
//! comparison summary and charts.
//!
//! Synchronous on purpose: servers are started and stopped between runs, and
//! each run is one `block_on` on the generator's runtime.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::chart::{self, Series, SweepPoint};
use crate::driver;
use crate::report::Report;
use crate::runner::{self, ProgressFn, RunOptions};
use crate::scenario::Scenario;
use crate::sweep::{Sweep, SweepSpec};
use crate::targets::{self, ServerCaps, TargetSpec};

/// What to run.
pub struct Plan {
    /// Scenario file text.
    pub scenario_yaml: String,
    /// `--set` overrides.
    pub overrides: Vec<(String, String)>,
    /// The sweep, or `None` for one run per target.
    pub sweep: Option<SweepSpec>,
    /// The servers.
    pub targets: Vec<TargetSpec>,
    /// How started servers are confined.
    pub caps: ServerCaps,
    /// pid of an already-running server (single target without `start`).
    pub server_pid: Option<u32>,
    /// Observer users per room.
    pub observers_per_room: u64,
    /// Local addresses to connect from.
    pub bind: Vec<std::net::IpAddr>,
    /// Connect/join/response timeout.
    pub timeout: Duration,
    /// Where results go.
    pub out: Option<PathBuf>,
    /// Called with a line of news (a point started or ended).
    pub say: Arc<dyn Fn(&str) + Send + Sync>,
    /// Live progress of each run, if wanted.
    pub progress: Option<ProgressFn>,
}

/// One measured point.
#[derive(Debug, Clone, Serialize)]
pub struct PointResult {
    /// The swept parameter's value (`None`: no sweep).
    pub value: Option<u64>,
    /// Whether every expectation held.
    pub passed: bool,
    /// The run's report.
    pub report: Report,
}

/// One target's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct TargetResult {
    /// Target name.
    pub target: String,
    /// Driver.
    pub driver: String,
    /// Why it was not run (or stopped early), if so.
    pub skipped: Option<String>,
    /// Points in the order run.
    pub points: Vec<PointResult>,
    /// Largest passing value of the sweep.
    pub max_passing: Option<u64>,
    /// Smallest failing value of the sweep.
    pub min_failing: Option<u64>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Scenario name.
    pub scenario: String,
    /// The sweep, if any.
    pub sweep: Option<SweepSpec>,
    /// Server confinement, as given.
    pub server_cpus: Option<Vec<usize>>,
    /// Server CPU quota, as given.
    pub server_cpu_quota: Option<f64>,
    /// Every target.
    pub targets: Vec<TargetResult>,
}

/// Runs the plan. Errors only for what makes the whole plan impossible (a
/// scenario that does not parse); a target that cannot start is skipped.
pub fn run_plan(plan: &Plan, rt: &tokio::runtime::Runtime) -> Result<Comparison, String> {
    let base = Scenario::parse(&plan.scenario_yaml, &plan.overrides).map_err(|e| e.to_string())?;
    if let Some(s) = &plan.sweep {
        if !base.params.contains_key(&s.param) {
            return Err(format!(
                "--find-max {}: the scenario has no parameter {:?} (it has: {})",
                s.param,
                s.param,
                base.params.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    if let Some(out) = &plan.out {
        std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    let mut results = Vec::new();
    for target in &plan.targets {
        let r = run_target(plan, target, rt);
        if let Some(why) = &r.skipped {
            (plan.say)(&format!("{}: {why}", target.name));
        }
        results.push(r);
    }
    let comparison = Comparison {
        scenario: base.name.clone(),
        sweep: plan.sweep.clone(),
        server_cpus: plan.caps.cpus.clone(),
        server_cpu_quota: plan.caps.quota,
        targets: results,
    };
    if let Some(out) = &plan.out {
        write_outputs(&comparison, out)?;
    }
    Ok(comparison)
}

fn run_target(plan: &Plan, target: &TargetSpec, rt: &tokio::runtime::Runtime) -> TargetResult {
    let mut result = TargetResult {
        target: target.name.clone(),
        driver: target.driver.clone(),
        skipped: None,
        points: Vec::new(),
        max_passing: None,
        min_failing: None,
    };
    let drv = match driver::by_name(&target.driver) {
        Ok(d) => d,
        Err(e) => {
            result.skipped = Some(e);
            return result;
        }
    };
    let mut sweep = plan.sweep.clone().map(Sweep::new);
    loop {
        // Without a sweep: one run. With one: its values until it is over.
        let value = match &sweep {
            None => None,
            Some(s) => match s.next_value() {
                Some(v) => Some(v),
                None => break,
            },
        };
        let point = match run_point(plan, target, &drv, value, rt) {
            Ok(p) => p,
            Err(e) => {
                result.skipped = Some(e);
                break;
            }
        };
        let label = match (&plan.sweep, value) {
            (Some(s), Some(v)) => format!(" {}={v}", s.param),
            _ => String::new(),
        };
        (plan.say)(&format!("{}{label}: {}", target.name, one_line(&point)));
        let passed = point.passed;
        result.points.push(point);
        match (&mut sweep, value) {
            (Some(s), Some(v)) => s.record(v, passed),
            _ => break,
        }
    }
    if let Some(s) = &sweep {
        result.max_passing = s.max_passing();
        result.min_failing = s.min_failing();
    }
    result
}

fn run_point(
    plan: &Plan,
    target: &TargetSpec,
    drv: &Arc<dyn driver::Driver>,
    value: Option<u64>,
    rt: &tokio::runtime::Runtime,
) -> Result<PointResult, String> {
    let mut overrides = plan.overrides.clone();
    if let (Some(s), Some(v)) = (&plan.sweep, value) {
        overrides.push((s.param.clone(), v.to_string()));
    }
    let scenario = Scenario::parse(&plan.scenario_yaml, &overrides).map_err(|e| e.to_string())?;
    let point_dir = plan
        .out
        .as_ref()
        .map(|o| point_dir(o, &target.name, plan, value));
    if let Some(d) = &point_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let log = point_dir
        .as_ref()
        .map_or_else(std::env::temp_dir, Clone::clone)
        .join(format!("{}-server.log", target.name));
    let server = target.launch(&plan.caps, &log)?;
    let server_pid = server.as_ref().map(|s| s.pid).or(plan.server_pid);
    let addr = targets::resolve(&target.address)?;
    let opts = RunOptions {
        addr,
        host: targets::address_of(&target.address).to_owned(),
        driver: drv.clone(),
        observers_per_room: plan.observers_per_room,
        server_pid,
        bind: plan.bind.clone(),
        timeout: plan.timeout,
        progress: plan.progress.clone(),
        shard: None,
    };
    let outcome = rt.block_on(runner::run(&scenario, opts));
    if let Some(s) = server {
        s.stop();
    }
    let report = outcome.map_err(|e| e.to_string())?;
    if let Some(d) = &point_dir {
        report.write_to(d)?;
    }
    Ok(PointResult {
        value,
        passed: report.passed,
        report,
    })
}

fn point_dir(out: &Path, target: &str, plan: &Plan, value: Option<u64>) -> PathBuf {
    let dir = out.join(target);
    match (&plan.sweep, value) {
        (Some(s), Some(v)) => dir.join(format!("{}-{v}", s.param)),
        _ => dir,
    }
}

fn one_line(p: &PointResult) -> String {
    let r = &p.report;
    let lat = r.latency.as_ref().map_or("—".into(), |l| {
        format!("mean {:.1} ms, p99 {:.1} ms", l.mean_ms, l.p99_ms)
    });
    format!(
        "{} — {:.0} deliveries/s, {}, delivered {}, server CPU {}{}",
        if p.passed { "pass" } else { "FAIL" },
        r.received_per_s,
        lat,
        r.delivery_ratio
            .map_or("—".into(), |d| format!("{:.2} %", d * 100.0)),
        r.server_cpu_percent
            .map_or("—".into(), |c| format!("{c:.0} %")),
        if p.report.generator_busy {
            " (generator busy!)"
        } else {
            ""
        }
    )
}

/// The comparison as Markdown: the largest passing value per target, then
/// every point.
pub fn markdown(c: &Comparison) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### {} — comparison\n", c.scenario);
    if let Some(cpus) = &c.server_cpus {
        let _ = writeln!(s, "Server pinned to CPU(s) {cpus:?}.");
    }
    if let Some(q) = c.server_cpu_quota {
        let _ = writeln!(s, "Server CPU quota {q} CPU.");
    }
    if let Some(sw) = &c.sweep {
        let _ = writeln!(
            s,
            "\n`{}` from {} by {} to {} (bisected to {}):\n",
            sw.param, sw.from, sw.step, sw.to, sw.resolution
        );
        let _ = writeln!(
            s,
            "| target | largest passing {} | first failing |",
            sw.param
        );
        let _ = writeln!(s, "|---|---|---|");
        for t in &c.targets {
            let fmt = |v: Option<u64>| v.map_or("—".to_owned(), |v| v.to_string());
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                t.target,
                fmt(t.max_passing),
                fmt(t.min_failing)
            );
        }
    }
    let _ = writeln!(
        s,
        "\n| target | {} | result | deliveries/s | delivered | latency mean / p99 (ms) | server CPU | µs / delivery | server RSS | generator CPU |",
        c.sweep.as_ref().map_or("run", |sw| sw.param.as_str())
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for t in &c.targets {
        if let Some(why) = &t.skipped {
            let _ = writeln!(s, "| {} | — | skipped: {why} | | | | | | | |", t.target);
        }
        for p in &t.points {
            let r = &p.report;
            let opt = |v: Option<f64>, d: usize, unit: &str| {
                v.map_or("—".to_owned(), |v| format!("{v:.d$}{unit}"))
            };
            let failed: Vec<&str> = r
                .checks
                .iter()
                .filter(|c| !c.passed)
                .map(|c| c.name.as_str())
                .collect();
            let outcome = if p.passed {
                "pass".to_owned()
            } else {
                format!("FAIL ({})", failed.join(", "))
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {}{} |",
                t.target,
                p.value.map_or("—".into(), |v| v.to_string()),
                outcome,
                r.received_per_s,
                opt(r.delivery_ratio.map(|d| d * 100.0), 2, " %"),
                r.latency.as_ref().map_or("—".into(), |l| format!(
                    "{:.2} / {:.2}",
                    l.mean_ms, l.p99_ms
                )),
                opt(r.server_cpu_percent, 1, " %"),
                opt(r.server_cpu_us_per_delivery, 2, ""),
                opt(r.server_rss_kib.map(|k| k as f64 / 1024.0), 1, " MiB"),
                opt(r.generator_cpu_percent, 1, " %"),
                if p.report.generator_busy { " ⚠" } else { "" }
            );
        }
    }
    s
}

/// The chart series of a sweep: one per target with points.
pub fn series(c: &Comparison) -> Vec<Series> {
    c.targets
        .iter()
        .filter(|t| !t.points.is_empty())
        .map(|t| Series {
            target: t.target.clone(),
            points: t
                .points
                .iter()
                .filter_map(|p| {
                    Some(SweepPoint {
                        members: p.value?,
                        latency_mean_ms: p.report.latency.as_ref().map(|l| l.mean_ms),
                        latency_p99_ms: p.report.latency.as_ref().map(|l| l.p99_ms),
                        deliveries_per_s: p.report.received_per_s,
                        passed: p.passed,
                    })
                })
                .collect(),
        })
        .collect()
}

/// The scenario name and chart series of a `comparison.json` written by an
/// earlier run, for `plaza bench chart` (charts over several runs).
pub fn series_from_json(v: &serde_json::Value) -> (String, Vec<Series>) {
    let scenario = v["scenario"].as_str().unwrap_or("comparison").to_owned();
    let series = v["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| Series {
            target: t["target"].as_str().unwrap_or("?").to_owned(),
            points: t["points"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    let r = &p["report"];
                    Some(SweepPoint {
                        members: p["value"].as_u64()?,
                        latency_mean_ms: r["latency"]["mean_ms"].as_f64(),
                        latency_p99_ms: r["latency"]["p99_ms"].as_f64(),
                        deliveries_per_s: r["received_per_s"].as_f64().unwrap_or(0.0),
                        passed: p["passed"].as_bool().unwrap_or(false),
                    })
                })
                .collect(),
        })
        .filter(|s: &Series| !s.points.is_empty())
        .collect();
    (scenario, series)
}

fn write_outputs(c: &Comparison, out: &Path) -> Result<(), String> {
    let json = serde_json::to_string_pretty(c).map_err(|e| e.to_string())?;
    std::fs::write(out.join("comparison.json"), json).map_err(|e| e.to_string())?;
    std::fs::write(out.join("comparison.md"), markdown(c)).map_err(|e| e.to_string())?;
    if c.sweep.is_some() {
        let mut points: Vec<Series> = series(c);
        // Bisection runs values out of order: charts want them sorted.
        for s in &mut points {
            s.points.sort_by_key(|p| p.members);
        }
        chart::draw_sweep_charts(&c.scenario, &points, out).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeping_a_parameter_the_scenario_lacks_fails_before_anything_runs() {
        let said = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = said.clone();
        let plan = Plan {
            scenario_yaml: "name: s\nparams: {members: 2}\nphases: [{name: a, duration_s: 1}]\nflows: [{name: f, steps: [connect]}]\n".into(),
            overrides: vec![],
            sweep: Some(SweepSpec {
                param: "users".into(),
                from: 1,
                step: 1,
                to: 2,
                resolution: 1,
            }),
            targets: vec![],
            caps: ServerCaps::default(),
            server_pid: None,
            observers_per_room: 1,
            bind: vec![],
            timeout: Duration::from_secs(1),
            out: None,
            say: Arc::new(move |l| log.lock().unwrap().push(l.to_owned())),
            progress: None,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let err = run_plan(&plan, &rt).unwrap_err();
        assert!(
            err.contains("no parameter \"users\"") && err.contains("members"),
            "{err}"
        );
        assert!(said.lock().unwrap().is_empty(), "nothing ran");
    }

    #[test]
    fn a_target_with_an_unknown_driver_is_skipped_with_the_reason() {
        let plan = Plan {
            scenario_yaml: "name: s\nphases: [{name: a, duration_s: 1}]\nflows: [{name: f, steps: [connect]}]\n".into(),
            overrides: vec![],
            sweep: None,
            targets: vec![TargetSpec {
                name: "x".into(),
                driver: "nope".into(),
                address: "127.0.0.1:9".into(),
                start: None,
                cwd: None,
                env: Default::default(),
                ready_timeout_s: 1,
            }],
            caps: ServerCaps::default(),
            server_pid: None,
            observers_per_room: 1,
            bind: vec![],
            timeout: Duration::from_secs(1),
            out: None,
            say: Arc::new(|_| {}),
            progress: None,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let c = run_plan(&plan, &rt).unwrap();
        let why = c.targets[0].skipped.as_deref().unwrap_or_default();
        assert!(why.contains("unknown driver \"nope\""), "{why}");
        assert!(c.targets[0].points.is_empty());
    }

    #[test]
    fn series_come_back_from_a_comparison_file() {
        let v = serde_json::json!({
            "scenario": "room-broadcast",
            "targets": [
                {"target": "plaza", "points": [
                    {"value": 200, "passed": true,
                     "report": {"latency": {"mean_ms": 2.5, "p99_ms": 7.0}, "received_per_s": 79000.0}},
                    {"value": 400, "passed": false,
                     "report": {"latency": null, "received_per_s": 1.0}}
                ]},
                {"target": "skipped", "points": []}
            ]
        });
        let (name, series) = series_from_json(&v);
        assert_eq!(name, "room-broadcast");
        assert_eq!(series.len(), 1, "targets without points are left out");
        let p = &series[0].points;
        assert_eq!(
            (p[0].members, p[0].latency_mean_ms, p[0].passed),
            (200, Some(2.5), true)
        );
        assert_eq!(
            (p[1].members, p[1].latency_mean_ms, p[1].passed),
            (400, None, false)
        );
    }
}
