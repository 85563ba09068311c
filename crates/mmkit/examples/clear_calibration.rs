//! What the clearing calibration costs at start-up: each run of this example is
//! a fresh process whose first `clear_calibration()` measures, and it prints the
//! figures, the plan and the time (wall clock and the calibrating thread's CPU
//! time). Loop it in the shell for a distribution:
//! `for i in $(seq 20); do target/release/examples/clear_calibration; done`.
fn main() {
    match mmkit::clear_calibration() {
        Some(c) => println!("{c}"),
        None => println!(
            "no calibration (no buffer); plan {}",
            mmkit::clear_plan().unwrap()
        ),
    }
}
