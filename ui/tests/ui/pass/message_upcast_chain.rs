// An upcast chain v1 -> v2 -> v3: each older version names the next one (by
// name or by path) and converts into it with `From`.
use messaging::prelude::*;

mod current {
    use messaging::prelude::*;

    #[messaging::message(name = "users.signed_up", v = 3, id = user_id)]
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SignedUp {
        pub user_id: String,
        pub email: String,
        pub referrer: Option<String>,
    }
}

#[messaging::message(name = "users.signed_up", v = 2, upcast = current::SignedUp)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignedUpV2 {
    pub user_id: String,
    pub email: String,
}

#[messaging::message(name = "users.signed_up", v = 1, upcast = SignedUpV2)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignedUpV1 {
    pub user_id: String,
}

impl From<SignedUpV2> for current::SignedUp {
    fn from(v2: SignedUpV2) -> Self {
        current::SignedUp { user_id: v2.user_id, email: v2.email, referrer: None }
    }
}

impl From<SignedUpV1> for SignedUpV2 {
    fn from(v1: SignedUpV1) -> Self {
        SignedUpV2 { email: format!("{}@unknown.invalid", v1.user_id), user_id: v1.user_id }
    }
}

fn main() {
    assert_eq!(SignedUpV1::VERSION, 1);
    assert_eq!(SignedUpV2::VERSION, 2);
    assert_eq!(current::SignedUp::VERSION, 3);
    assert_eq!(SignedUpV1::NAME, current::SignedUp::NAME);
    let v3 = current::SignedUp::from(SignedUpV2::from(SignedUpV1 { user_id: "u1".into() }));
    assert_eq!(v3.email, "u1@unknown.invalid");
}
