//! Runs the validation on a case file and prints the JSON report:
//! `cargo run --release --example validate -- CASES.json [--search]`.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&args[1]).expect("read cases");
    let calibration = args.iter().position(|a| a == "--calibration").map(|i| {
        meshplan_core::calibration::parse_overrides(&std::fs::read_to_string(&args[i + 1]).unwrap())
            .unwrap()
    });
    let options = meshplan_core::validation::ValidateOptions {
        search: args.iter().any(|a| a == "--search"),
        calibration,
        ..Default::default()
    };
    let report = meshplan_core::validation::validate(&text, &options).expect("validate");
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
