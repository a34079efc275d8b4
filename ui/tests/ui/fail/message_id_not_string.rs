use messaging::prelude::*;

#[messaging::message(name = "readings.taken", v = 1, id = value)]
#[derive(Serialize, Deserialize)]
pub struct ReadingTaken {
    pub value: f64,
}

fn main() {}
