//! Evictions and pod deletions from kube-apiserver's audit log (see
//! [`crate::ControlPlane::audit_log_path`]): the only record of a second eviction of a pod that
//! is already terminating, which changes nothing a watch could see.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use super::rules::Eviction;

/// Reads the audit log from where it last stopped.
#[derive(Debug)]
pub struct AuditTail {
    path: PathBuf,
    offset: u64,
    partial: String,
    /// Only requests of this user count (the operator's service account).
    user: String,
}

impl AuditTail {
    /// Starts at the log's end: what came before is another test's or another run's.
    pub fn new(path: PathBuf, user: String) -> Self {
        let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
        Self {
            path,
            offset,
            partial: String::new(),
            user,
        }
    }

    /// The accepted evictions and deletions by the user written since the last call.
    pub fn read(&mut self) -> Vec<Eviction> {
        let user = self.user.clone();
        self.lines()
            .lines()
            .filter_map(|line| parse(line, &user))
            .collect()
    }

    /// Every request audited since the last call, whoever made it.
    pub fn requests(&mut self) -> Vec<AuditedRequest> {
        self.lines().lines().filter_map(request).collect()
    }

    /// The complete lines written since the last call.
    fn lines(&mut self) -> String {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return String::new();
        };
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return String::new();
        }
        let mut bytes = Vec::new();
        let Ok(read) = file.read_to_end(&mut bytes) else {
            return String::new();
        };
        self.offset += read as u64;
        self.partial.push_str(&String::from_utf8_lossy(&bytes));
        let Some(end) = self.partial.rfind('\n') else {
            return String::new();
        };
        self.partial.drain(..=end).collect()
    }
}

/// One request as the API server audited it, with its own timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditedRequest {
    pub verb: String,
    pub user: String,
    /// `pods`, `deployments`, ….
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub code: u16,
    /// When the API server received it.
    pub received: Timestamp,
    /// When it answered it (the change stored, for a write that succeeded).
    pub answered: Timestamp,
}

fn request(line: &str) -> Option<AuditedRequest> {
    let line: Line = serde_json::from_str(line).ok()?;
    let object = line.object_ref?;
    Some(AuditedRequest {
        verb: line.verb,
        user: line.user.username,
        resource: object.resource?,
        subresource: object.subresource,
        namespace: object.namespace,
        name: object.name,
        code: line.response_status?.code,
        received: line.request_received_timestamp.parse().ok()?,
        answered: line.stage_timestamp.parse().ok()?,
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Line {
    verb: String,
    user: User,
    object_ref: Option<ObjectRef>,
    response_status: Option<ResponseStatus>,
    request_received_timestamp: String,
    #[serde(default)]
    stage_timestamp: String,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    code: u16,
}

/// One audit line, if it is an accepted eviction or deletion of a pod by `user`.
pub(crate) fn parse(line: &str, user: &str) -> Option<Eviction> {
    let line: Line = serde_json::from_str(line).ok()?;
    let object = line.object_ref?;
    let code = line.response_status?.code;
    if line.user.username != user
        || object.resource.as_deref() != Some("pods")
        || !(200..300).contains(&code)
    {
        return None;
    }
    let verb = match (line.verb.as_str(), object.subresource.as_deref()) {
        ("create", Some("eviction")) => "evict",
        ("delete", None) => "delete",
        _ => return None,
    };
    let at: Timestamp = line.request_received_timestamp.parse().ok()?;
    Some(Eviction {
        at_ms: u64::try_from(at.as_millisecond()).ok()?,
        pod: format!("{}/{}", object.namespace?, object.name?),
        verb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPERATOR: &str = "system:serviceaccount:gpuqueue-system:gpuqueue-operator";

    fn line(verb: &str, subresource: Option<&str>, user: &str, code: u16) -> String {
        serde_json::json!({
            "kind": "Event", "level": "Metadata", "stage": "ResponseComplete", "verb": verb,
            "user": {"username": user},
            "objectRef": {"resource": "pods", "namespace": "b", "name": "b1", "subresource": subresource},
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": "2026-12-01T21:30:00.123456Z",
        })
        .to_string()
    }

    #[test]
    fn accepted_evictions_and_deletions_by_the_operator_count_and_nothing_else() {
        let eviction = parse(&line("create", Some("eviction"), OPERATOR, 201), OPERATOR).unwrap();
        assert_eq!(eviction.pod, "b/b1");
        assert_eq!(eviction.verb, "evict");
        assert_eq!(eviction.at_ms % 1000, 123);
        assert_eq!(
            parse(&line("delete", None, OPERATOR, 200), OPERATOR)
                .unwrap()
                .verb,
            "delete"
        );
        assert!(
            parse(&line("create", Some("eviction"), OPERATOR, 429), OPERATOR).is_none(),
            "refused"
        );
        assert!(
            parse(&line("delete", None, "tenant", 200), OPERATOR).is_none(),
            "churn"
        );
        assert!(
            parse(&line("create", None, OPERATOR, 201), OPERATOR).is_none(),
            "a pod created"
        );
    }

    #[test]
    fn the_tail_reads_whole_lines_once() {
        let path =
            std::env::temp_dir().join(format!("gpuqueue-e2e-audit-{}.log", std::process::id()));
        std::fs::write(
            &path,
            line("create", Some("eviction"), OPERATOR, 201) + "\n",
        )
        .unwrap();
        let mut tail = AuditTail::new(path.clone(), OPERATOR.to_owned());
        assert!(
            tail.read().is_empty(),
            "lines before the start are not ours"
        );
        let next = line("delete", None, OPERATOR, 200);
        let (first, rest) = next.split_at(20);
        std::fs::write(
            &path,
            format!(
                "{}\n{first}",
                line("create", Some("eviction"), OPERATOR, 201)
            ),
        )
        .unwrap();
        // The file was rewritten longer; only what follows the old end is read.
        let read = tail.read();
        assert!(read.is_empty(), "{read:?}");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{rest}\n").as_bytes()))
            .unwrap();
        let read = tail.read();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].verb, "delete");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_request_keeps_the_api_servers_microsecond_times() {
        let line = serde_json::json!({
            "kind": "Event", "level": "Metadata", "stage": "ResponseComplete", "verb": "create",
            "user": {"username": "system:kube-scheduler"},
            "objectRef": {"resource": "pods", "namespace": "o", "name": "p", "subresource": "binding"},
            "responseStatus": {"code": 201},
            "requestReceivedTimestamp": "2026-12-01T21:30:00.123456Z",
            "stageTimestamp": "2026-12-01T21:30:00.130001Z",
        })
        .to_string();
        let seen = request(&line).unwrap();
        assert_eq!(seen.subresource.as_deref(), Some("binding"));
        assert_eq!(
            seen.answered.duration_since(seen.received).as_micros(),
            6_545
        );
        assert_eq!(parse(&line, "system:kube-scheduler"), None, "no eviction");
    }
}
