#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! Every scenario in examples/sim/ parses, and the Helios one carries the real quotas.

use std::path::{Path, PathBuf};

use gpuqueue_sim::data::{self, HELIOS_DIR};
use gpuqueue_sim::scenario::Scenario;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn data_dir() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    data::find_data_dir(here).unwrap_or_else(|| panic!("{}", data::missing_data_message(here)))
}

#[test]
fn every_example_scenario_parses() {
    let dir = repo().join("examples/sim");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let loaded = Scenario::load(&path, Some(&data_dir())).unwrap_or_else(|e| panic!("{e}"));
            if let Some(trace) = &loaded.shape_trace {
                assert!(
                    trace.is_file(),
                    "{}: {} is missing",
                    path.display(),
                    trace.display()
                );
            }
            seen += 1;
        }
    }
    assert!(seen >= 3, "examples/sim/ holds {seen} scenarios");
}

#[test]
fn helios_scenario_has_the_venus_quotas_of_its_day() {
    let loaded = Scenario::load(
        &repo().join("examples/sim/helios-venus.yaml"),
        Some(&data_dir()),
    )
    .unwrap();
    let csv = std::fs::read_to_string(data_dir().join(HELIOS_DIR).join("cluster_gpu_number.csv"))
        .unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let day: Vec<&str> = lines
        .find(|l| l.starts_with("2020-09-28,"))
        .unwrap()
        .split(',')
        .collect();
    let mut expected: Vec<(String, u32)> = header[1..header.len() - 1]
        .iter()
        .zip(&day[1..day.len() - 1])
        .map(|(vc, q)| (vc.to_lowercase(), q.parse().unwrap()))
        .filter(|(_, q)| *q > 0)
        .collect();
    expected.sort();
    let mut actual: Vec<(String, u32)> = loaded
        .scenario
        .tenants
        .iter()
        .map(|t| (t.name.clone(), t.guaranteed))
        .collect();
    actual.sort();
    assert_eq!(actual, expected);
    let total: u64 = day[day.len() - 1].parse().unwrap();
    assert_eq!(loaded.scenario.guaranteed_total(), total);
    let pools = &loaded.scenario.cluster.pools;
    assert_eq!(
        pools
            .iter()
            .map(|p| u64::from(p.count * p.gpus))
            .sum::<u64>(),
        total
    );
}
