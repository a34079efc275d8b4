//! Versioned envelopes: upcasting through a chain, the legacy fallback of
//! single-type queues, routing on multi-type queues, and no silent loss for
//! what cannot be decoded. Plus a property test of the decoder.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use messaging::envelope::DecodeError;
use messaging::prelude::*;
use messaging::registry::Registry;
use messaging::testing::TestApp;
use messaging::transport::Outgoing;
use proptest::prelude::*;

#[messaging::queue("env-single", dlq = "env-single-dlq", max_receives = 2)]
struct Single;

#[messaging::queue("env-multi", dlq = "env-multi-dlq", max_receives = 2)]
struct Multi;

#[messaging::queue("env-legacy", dlq = "env-legacy-dlq", max_receives = 2)]
struct Legacy;

/// v3, the current version.
#[messaging::message(name = "env.placed", v = 3)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Placed {
    order_id: String,
    coupon: Option<String>,
    total_cents: u64,
}

#[messaging::message(name = "env.placed", v = 2, upcast = Placed)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlacedV2 {
    order_id: String,
    coupon: Option<String>,
}

#[messaging::message(name = "env.placed", v = 1, upcast = PlacedV2)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlacedV1 {
    id: String,
}

impl From<PlacedV1> for PlacedV2 {
    fn from(v1: PlacedV1) -> Self {
        PlacedV2 { order_id: v1.id, coupon: None }
    }
}

impl From<PlacedV2> for Placed {
    fn from(v2: PlacedV2) -> Self {
        Placed { order_id: v2.order_id, coupon: v2.coupon, total_cents: 0 }
    }
}

#[messaging::message(name = "env.cancelled", v = 1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cancelled {
    order_id: String,
}

/// An unmapped type: travels as a bare JSON body.
#[messaging::message]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Note {
    text: String,
}

type Log = Arc<Mutex<Vec<String>>>;

/// Everything logged at WARN or above by this test binary (one subscriber
/// for the process: other modules' tests read it too).
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// What has been logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

pub(crate) fn warnings() -> &'static Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .init();
        captured
    })
}

#[messaging::handler(queue = Single)]
async fn on_single(p: Placed, ctx: MessageContext, log: State<Log>) {
    log.lock().unwrap().push(format!(
        "single {} {:?} {} wire={:?}",
        p.order_id,
        p.coupon,
        p.total_cents,
        ctx.wire_version()
    ));
}

#[messaging::handler(queue = Multi)]
async fn on_multi_placed(p: Placed, log: State<Log>) {
    log.lock().unwrap().push(format!("multi placed {}", p.order_id));
}

#[messaging::handler(queue = Multi)]
async fn on_multi_cancelled(c: Cancelled, log: State<Log>) {
    log.lock().unwrap().push(format!("multi cancelled {}", c.order_id));
}

#[messaging::handler(queue = Legacy)]
async fn on_note(n: Note, log: State<Log>) {
    log.lock().unwrap().push(format!("note {}", n.text));
}

async fn app() -> (TestApp, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let app = TestApp::builder()
        .only::<Single>()
        .only::<Multi>()
        .only::<Legacy>()
        .timeout(Duration::from_secs(20))
        .setup(move |s| {
            s.provide(l);
        })
        .start()
        .await
        .unwrap();
    (app, log)
}

async fn raw(app: &TestApp, queue: &str, body: &str) -> MessageId {
    app.transport()
        .send(queue, Outgoing { body: body.as_bytes().to_vec().into(), ..Outgoing::default() })
        .await
        .unwrap()
}

#[tokio::test]
async fn every_version_arrives_as_the_current_one() {
    let (app, log) = app().await;
    let p = app.publisher();
    let a = p.send::<Single, _>(&PlacedV1 { id: "A".into() }).await.unwrap();
    app.handled(&a).await.unwrap();
    let b = p.send::<Single, _>(&PlacedV2 { order_id: "B".into(), coupon: Some("C10".into()) }).await.unwrap();
    app.handled(&b).await.unwrap();
    let c = p.send::<Single, _>(&Placed { order_id: "C".into(), coupon: None, total_cents: 42 }).await.unwrap();
    app.handled(&c).await.unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        ["single A None 0 wire=Some(1)", "single B Some(\"C10\") 0 wire=Some(2)", "single C None 42 wire=Some(3)",]
    );
    app.stop().await;
}

#[tokio::test]
async fn the_wire_format_is_the_documented_envelope() {
    let body = messaging::envelope::encode(&PlacedV1 { id: "A".into() }).unwrap();
    assert_eq!(String::from_utf8(body).unwrap(), r#"{"type":"env.placed","v":1,"data":{"id":"A"}}"#);
    let bare = messaging::envelope::encode(&Note { text: "hi".into() }).unwrap();
    assert_eq!(String::from_utf8(bare).unwrap(), r#"{"text":"hi"}"#);
}

#[tokio::test]
async fn single_type_queues_read_bare_bodies_as_their_type() {
    let (app, log) = app().await;
    let a = raw(&app, "env-single", r#"{"order_id":"L1","coupon":null,"total_cents":7}"#).await;
    app.handled(&a).await.unwrap();
    // An envelope of a name this service does not know: read as the queue's type.
    let b = raw(&app, "env-legacy", r#"{"type":"other.system","v":1,"data":{},"text":"from elsewhere"}"#).await;
    app.handled(&b).await.unwrap();
    let c = app.publisher().send::<Legacy, _>(&Note { text: "bare".into() }).await.unwrap();
    app.handled(&c).await.unwrap();
    assert_eq!(*log.lock().unwrap(), ["single L1 None 7 wire=None", "note from elsewhere", "note bare"]);
    app.stop().await;
}

#[tokio::test]
async fn multi_type_queues_route_by_type_name() {
    let (app, log) = app().await;
    let p = app.publisher();
    let a = p.send::<Multi, _>(&Cancelled { order_id: "X".into() }).await.unwrap();
    let b = p.send::<Multi, _>(&PlacedV1 { id: "Y".into() }).await.unwrap();
    app.handled(&a).await.unwrap();
    app.handled(&b).await.unwrap();
    let mut seen = log.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, ["multi cancelled X", "multi placed Y"]);
    app.stop().await;
}

#[tokio::test]
async fn what_cannot_be_decoded_is_retried_then_dead_lettered_with_the_reason() {
    let captured = warnings();
    let (app, log) = app().await;
    let cases = [
        ("env-single", r#"{"type":"env.placed","v":4,"data":{"order_id":"N"}}"#, "newer than the current v3"),
        ("env-single", r#"{"type":"env.placed","v":"2","data":{}}"#, "malformed envelope"),
        ("env-single", r#"{"type":"env.placed","v":3,"data":{"order_id":7}}"#, "does not fit"),
        ("env-single", r#"{"type":"env.cancelled","v":1,"data":{"order_id":"Z"}}"#, "no handler"),
        ("env-single", "\u{1}not json", "not valid JSON"),
        ("env-multi", r#"{"type":"unknown.type","v":1,"data":{}}"#, "no handler"),
        ("env-multi", r#"{"order_id":"bare"}"#, "no handler"),
    ];
    let mut ids = Vec::new();
    for (queue, body, _) in cases {
        ids.push(raw(&app, queue, body).await);
    }
    for (id, (queue, body, why)) in ids.iter().zip(cases) {
        app.dead_lettered(id).await.unwrap_or_else(|e| panic!("{queue} {body}: {e}"));
        let history = app.history(id);
        assert_eq!(history.len(), 2, "received max_receives times: {history:?}");
        assert!(
            history
                .iter()
                .all(|o| matches!(o, messaging::observe::Outcome::Undecodable { error } if error.contains(why))),
            "{body}: expected `{why}` in {history:?}"
        );
    }
    assert!(log.lock().unwrap().is_empty(), "no handler ran");
    let logged = captured.text();
    for id in &ids {
        let line = logged.lines().find(|l| l.contains(id.as_str()) && l.contains("failed attempt 1 of 2"));
        assert!(line.is_some_and(|l| l.contains("WARN")), "no WARN line for {id} in:\n{logged}");
        let line = logged.lines().find(|l| l.contains(id.as_str()) && l.contains("dead-lettering"));
        assert!(line.is_some_and(|l| l.contains("WARN")), "no dead-lettering line for {id} in:\n{logged}");
    }
    let dlq = app.transport().dead_letters().unwrap();
    assert_eq!(dlq.depth("env-single").await.unwrap(), 5);
    assert_eq!(dlq.depth("env-multi").await.unwrap(), 2);
    let mut letters = dlq.peek("env-single", 10).await.unwrap();
    letters.extend(dlq.peek("env-multi", 10).await.unwrap());
    for (id, (_, body, why)) in ids.iter().zip(cases) {
        let letter = letters.iter().find(|l| &l.message_id == id).unwrap();
        assert!(letter.reason.as_deref().is_some_and(|r| r.contains(why)), "{body}: reason {:?}", letter.reason);
    }
    app.stop().await;
}

// --- the decoder, property-tested ------------------------------------------------------

fn routes(queue: &str) -> Arc<messaging::registry::Routes> {
    let registry = Registry::from_inventory().expect("valid registry");
    registry.routes().iter().find(|r| r.spec().name == queue).cloned().expect("queue has handlers")
}

fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
        prop_oneof![Just("type"), Just("v"), Just("data"), Just("env.placed"), Just("order_id")]
            .prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(
                prop_oneof![Just("type".to_owned()), Just("v".to_owned()), Just("data".to_owned()), "[a-z_]{1,8}"],
                inner,
                0..5
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_decode_or_fail_with_a_typed_error(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        for queue in ["env-single", "env-multi", "env-legacy"] {
            let routes = routes(queue);
            match routes.decode(&bytes) {
                Ok(decoded) => prop_assert!(serde_json::from_slice::<serde_json::Value>(&bytes).is_ok(), "{:?}", decoded.type_name),
                Err(DecodeError::NotJson(_)) => prop_assert!(serde_json::from_slice::<serde_json::Value>(&bytes).is_err()),
                Err(_) => prop_assert!(serde_json::from_slice::<serde_json::Value>(&bytes).is_ok()),
            }
        }
    }

    #[test]
    fn arbitrary_json_decodes_or_fails_with_a_typed_error(value in json()) {
        let bytes = serde_json::to_vec(&value).unwrap();
        for queue in ["env-single", "env-multi", "env-legacy"] {
            let routes = routes(queue);
            let result = routes.decode(&bytes);
            prop_assert!(!matches!(result, Err(DecodeError::NotJson(_))), "valid JSON is never NotJson");
            if let Ok(decoded) = &result {
                // What decodes is a value of the handler's (current) type.
                prop_assert!(decoded.message_type() == decoded.message.as_ref().type_id());
            }
        }
    }

    #[test]
    fn every_published_version_round_trips(order_id in ".{0,20}", coupon in proptest::option::of(".{0,8}"), total in any::<u64>(), v in 1u32..=3) {
        let body = match v {
            1 => messaging::envelope::encode(&PlacedV1 { id: order_id.clone() }),
            2 => messaging::envelope::encode(&PlacedV2 { order_id: order_id.clone(), coupon: coupon.clone() }),
            _ => messaging::envelope::encode(&Placed { order_id: order_id.clone(), coupon: coupon.clone(), total_cents: total }),
        }.unwrap();
        for queue in ["env-single", "env-multi"] {
            let routes = routes(queue);
            let decoded = routes.decode(&body).unwrap();
            prop_assert_eq!(decoded.version, Some(v));
            let placed = decoded.message.downcast::<Placed>().unwrap();
            prop_assert_eq!(&placed.order_id, &order_id);
            prop_assert_eq!(placed.coupon.clone(), if v == 1 { None } else { coupon.clone() });
            prop_assert_eq!(placed.total_cents, if v == 3 { total } else { 0 });
        }
    }

    /// Envelopes in the exact form the framework writes are read in one
    /// pass; the result must be the general decoder's, whatever the data,
    /// version, name and what follows the data. The same envelope with a
    /// space after its opening brace goes through the general decoder.
    #[test]
    fn the_one_pass_decoder_agrees_with_the_general_one(
        name in prop_oneof![3 => Just("env.placed"), 1 => Just("env.cancelled"), 1 => Just("unknown.name"), 1 => Just("esc\\\"aped")],
        v in prop_oneof![
            1 => Just("0".to_owned()), 1 => Just("01".to_owned()), 1 => Just("4294967296".to_owned()),
            6 => (1u32..5).prop_map(|v| v.to_string()),
        ],
        data in prop_oneof![
            2 => json().prop_map(|d| d.to_string()),
            4 => (".{0,8}", proptest::option::of(".{0,4}"), any::<u64>()).prop_map(|(order_id, coupon, total)| {
                serde_json::json!({"order_id": order_id, "coupon": coupon, "total_cents": total}).to_string()
            }),
            2 => ".{0,8}".prop_map(|id| serde_json::json!({"id": id}).to_string()),
            1 => Just(r#"{"order_id":"A","order_id":"B"}"#.to_owned()),
            1 => Just(r#"{"order_id":"A"#.to_owned()),
        ],
        tail in prop_oneof![Just("}"), Just(" }"), Just("}}"), Just("} "), Just(r#","v":1}"#), Just(""), Just("]")],
    ) {
        let canonical = format!(r#"{{"type":"{name}","v":{v},"data":{data}{tail}"#);
        let general = format!(r#"{{ "type":"{name}","v":{v},"data":{data}{tail}"#);
        for queue in ["env-single", "env-multi", "env-legacy"] {
            let routes = routes(queue);
            match (routes.decode(canonical.as_bytes()), routes.decode(general.as_bytes())) {
                (Ok(fast), Ok(slow)) => {
                    prop_assert_eq!((fast.type_name, fast.version), (slow.type_name, slow.version));
                    prop_assert!(fast.message_type() == slow.message_type());
                    if let (Some(a), Some(b)) = (fast.message.downcast_ref::<Placed>(), slow.message.downcast_ref::<Placed>()) {
                        prop_assert_eq!(a, b);
                    }
                }
                // (The position in serde's message differs by the added space.)
                (Err(DecodeError::NotJson(_)), Err(DecodeError::NotJson(_))) => {}
                (Err(DecodeError::Payload { type_name: a, .. }), Err(DecodeError::Payload { type_name: b, .. })) => {
                    prop_assert_eq!(a, b)
                }
                (Err(fast), Err(slow)) => prop_assert_eq!(fast, slow),
                (fast, slow) => prop_assert!(false, "{queue}: {canonical} gave {:?}, {general} gave {:?}",
                    fast.map(|d| d.version), slow.map(|d| d.version)),
            }
        }
    }

    #[test]
    fn versions_newer_than_current_are_never_handled(v in 4u32..10_000, data in json()) {
        let body = serde_json::to_vec(&serde_json::json!({"type": "env.placed", "v": v, "data": data})).unwrap();
        for queue in ["env-single", "env-multi"] {
            let too_new = matches!(routes(queue).decode(&body), Err(DecodeError::TooNew { current: 3, .. }));
            prop_assert!(too_new);
        }
    }
}
