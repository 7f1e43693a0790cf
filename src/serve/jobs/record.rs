//! A job's record and the names it is kept by: in, an upload's query and what the service
//! finds of it; out, the record (`job.json`, or a row of the replicas' database) with its state,
//! the answer the API gives of it, and the ids and file names a job's folder may hold.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::engine::{Failure, Kind};

/// Where a job is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    #[default]
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl State {
    pub(crate) fn finished(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }

    /// The state in words, as the API and the replicas' database say it.
    pub(crate) fn word(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    /// The state a word names (`queued` for any other).
    pub(crate) fn of_word(s: &str) -> State {
        match s {
            "running" => State::Running,
            "done" => State::Done,
            "failed" => State::Failed,
            "cancelled" => State::Cancelled,
            _ => State::Queued,
        }
    }
}

/// What a job's query gives: its upload's name, its model, and the treatment's flags it sets
/// (the command line's names and values, parsed and checked by the treatment's own declaration:
/// [`Treatment::with_flags`] over [`crate::treatment::JOB_FLAGS`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct JobQuery {
    /// The upload's file name (its extension says what it is; shown and used for the download).
    pub(crate) name: Option<String>,
    /// One of [`offered_models`] by name (never a path).
    pub(crate) model: Option<String>,
    /// The flags as given (a record of an earlier version holds numbers and nulls here).
    #[serde(flatten)]
    pub(crate) flags: BTreeMap<String, serde_json::Value>,
}

impl JobQuery {
    /// The query of `raw` (`name=clip.mp4&blend=0.8`): every parameter but `name` and `model`
    /// is a flag, judged by the treatment ([`JobQuery::flags`]).
    pub(crate) fn parse(raw: &str) -> Result<JobQuery> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
            .map_err(|e| Failure::error(Kind::BadInput, format!("the query cannot be read ({e})")))?;
        let mut q = JobQuery::default();
        for (k, v) in pairs {
            let twice = match k.as_str() {
                "name" => q.name.replace(v).is_some(),
                "model" => q.model.replace(v).is_some(),
                _ => q.flags.insert(k.clone(), serde_json::Value::String(v)).is_some(),
            };
            if twice {
                return Err(Failure::error(Kind::BadInput, format!("{k}: given twice")));
            }
        }
        Ok(q)
    }

    /// The flags as the treatment takes them: (name, value) in text, nulls left out.
    pub(crate) fn flag_pairs(&self) -> Vec<(String, String)> {
        self.flags
            .iter()
            .filter_map(|(k, v)| match v {
                serde_json::Value::Null => None,
                serde_json::Value::String(s) => Some((k.clone(), s.clone())),
                other => Some((k.clone(), other.to_string())),
            })
            .collect()
    }
}

/// A job's record (`job.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) id: String,
    pub(crate) state: State,
    /// `video` or `photo`.
    pub(crate) kind: String,
    /// The upload's name as given (for display and the download's name).
    pub(crate) name: String,
    /// File names inside the job's folder.
    pub(crate) input: String,
    pub(crate) output: String,
    pub(crate) query: JobQuery,
    pub(crate) created: f64,
    pub(crate) started: Option<f64>,
    pub(crate) finished: Option<f64>,
    pub(crate) frames_done: u64,
    /// Faces restored in the frames done (a finished job with none found no face).
    #[serde(default)]
    pub(crate) faces_done: u64,
    pub(crate) frames_total: Option<u64>,
    pub(crate) fps: Option<f64>,
    /// What the faces became, once done: the worst track's identity, the tracks the identity
    /// guard backed off, the quality before and after (see `serve::face_boxes::Faithful`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) faithful: Option<crate::serve::face_boxes::Faithful>,
    pub(crate) error: Option<String>,
    pub(crate) result_bytes: Option<u64>,
    /// The opaque key of whoever made it (`X-Gpen-Owner`): a list answers each caller its own.
    /// Never shown in an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<String>,
    /// Set when the job is being removed (`DELETE`): a service stopped midway finishes the
    /// removal at its next start. A job cancelled (`POST .../cancel`) is kept, as cancelled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) removing: bool,
}

impl Record {
    /// Whether the record's file names are the plain names the service gives (`input.EXT`,
    /// `result.EXT`): a record changed outside the service may name nothing else.
    pub(crate) fn check_names(&self) -> Result<(), String> {
        for (field, value, stem) in [("input", &self.input, "input."), ("output", &self.output, "result.")] {
            if !value.strip_prefix(stem).is_some_and(valid_ext) {
                tracing::warn!(job = %self.id, "its record names {field} {value:?}");
                return Err(format!(
                    "has a record (job.json) whose {field} is not a file name the service gives (changed outside it)"
                ));
            }
        }
        Ok(())
    }

    /// The record as the API answers it: with progress, ETA and links.
    pub(crate) fn answer(&self) -> serde_json::Value {
        let progress = match (self.state, self.frames_total) {
            (State::Done, _) => 1.0,
            (_, Some(t)) if t > 0 => (self.frames_done as f64 / t as f64).min(1.0),
            _ => 0.0,
        };
        let eta = match (self.state, self.frames_total, self.fps) {
            (State::Running, Some(t), Some(fps)) if fps > 0.0 => Some(t.saturating_sub(self.frames_done) as f64 / fps),
            _ => None,
        };
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.remove("owner");
            o.remove("removing");
        }
        v["progress"] = serde_json::json!(progress);
        v["eta_s"] = serde_json::json!(eta);
        v["url"] = serde_json::json!(format!("/v1/jobs/{}", self.id));
        if self.state == State::Done {
            v["result_url"] = serde_json::json!(format!("/v1/jobs/{}/result", self.id));
            v["input_url"] = serde_json::json!(format!("/v1/jobs/{}/input", self.id));
            v["download_name"] = serde_json::json!(self.download_name());
        }
        v
    }

    /// The download's file name: the upload's stem, `-restored`, the result's extension.
    pub(crate) fn download_name(&self) -> String {
        let stem = Path::new(&self.name)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("job");
        let clean: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(80)
            .collect();
        let ext = Path::new(&self.output)
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("bin");
        format!("{clean}-restored.{ext}")
    }
}

/// Seconds since the Unix epoch: the time a record keeps.
pub(crate) fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A new job id: 128 bits from the system's random source, in hex.
pub(crate) fn new_id() -> Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no random bytes for a job id: {e}"))?;
    Ok(hex::encode(b))
}

/// Whether `id` has the form of a job id (32 lower-case hex digits): nothing else names a
/// folder, so no request can reach outside the jobs folder.
pub(crate) fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `ext` is an extension the service gives a job's files: 1 to 16 ASCII letters and
/// digits (so `input.EXT` and `result.EXT` are plain names inside the job's folder).
pub(crate) fn valid_ext(ext: &str) -> bool {
    (1..=16).contains(&ext.len()) && ext.bytes().all(|b| b.is_ascii_alphanumeric())
}
