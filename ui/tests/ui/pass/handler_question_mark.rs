// `?` in a handler on the errors handlers meet: anyhow, a boxed error, serde_json,
// std::io, String and &str. Each becomes a transient failure. (sqlx's, in
// tests/it/sql_errors.rs: as a dependency here, it doubled trybuild's build.)
use messaging::prelude::*;

#[messaging::queue("question-mark")]
pub struct Jobs;

#[messaging::message(name = "question.mark", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub path: String,
}

fn with_anyhow(job: &Job) -> anyhow::Result<()> {
    anyhow::ensure!(!job.path.is_empty(), "no path");
    Ok(())
}

fn with_box(job: &Job) -> Result<u16, Box<dyn std::error::Error + Send + Sync>> {
    Ok(job.path.parse::<u16>()?)
}

fn with_string(job: &Job) -> Result<(), String> {
    if job.path.is_empty() { Err(format!("empty path in {job:?}")) } else { Ok(()) }
}

fn with_str(job: &Job) -> Result<(), &'static str> {
    if job.path.len() > 100 { Err("path too long") } else { Ok(()) }
}

#[messaging::handler(queue = Jobs)]
async fn handle(job: Job) -> Result<(), HandlerError> {
    with_anyhow(&job)?;
    with_box(&job)?;
    with_string(&job)?;
    with_str(&job)?;
    std::fs::metadata(&job.path)?;
    serde_json::from_str::<u16>(&job.path)?;
    Err("a literal".into())
}

fn main() {}
