//! The pair's heartbeat key Secret (`havip-<pair>-key`): how it is read ([`key_info`])
//! and written — created with key 1, a rotation started (a new random key under the next
//! id, the old one kept as `previousKey`) and finished, the member set recorded. Every
//! change is a compare-and-swap on the resourceVersion. What to do and when is the
//! model's ([`crate::model::plan`]); this file only does it.

use crate::Error;
use crate::context::{Context, owned_meta};
use crate::error::is_status;
use crate::model::{self, KeyInfo};
use havip_crds::{HAPair, manager};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use std::collections::{BTreeMap, BTreeSet};

const ROTATION_ID: &str = "havip.io/rotation-id";
const ROTATION_STARTED: &str = "havip.io/rotation-started";
const KEY_MEMBERS: &str = "havip.io/members";

fn secret_data(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .map(|v| v.trim().to_owned())
}

/// Reads the key Secret into [`KeyInfo`].
pub fn key_info(s: &Secret) -> Result<KeyInfo, String> {
    let key = secret_data(s, "key").ok_or("data.key is missing")?;
    if key.len() != 64 || !key.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("data.key is not 64 hex digits".to_owned());
    }
    let key_id = secret_data(s, "keyId")
        .ok_or("data.keyId is missing")?
        .parse::<i64>()
        .map_err(|_| "data.keyId is not a decimal number".to_owned())?;
    let previous_key_id = match secret_data(s, "previousKeyId") {
        Some(v) => Some(v.parse::<i64>().map_err(|_| "data.previousKeyId is not a decimal number".to_owned())?),
        None => None,
    };
    let ann = s.annotations();
    Ok(KeyInfo {
        key_id,
        previous_key_id,
        rotation_id: ann.get(ROTATION_ID).cloned(),
        rotation_started: ann.get(ROTATION_STARTED).and_then(|t| t.parse::<Timestamp>().ok()),
        members: ann
            .get(KEY_MEMBERS)
            .map(|m| m.split(',').filter(|x| !x.is_empty()).map(str::to_owned).collect::<BTreeSet<_>>()),
    })
}

fn members_of(pair: &HAPair) -> String {
    let set: BTreeSet<&str> = pair.spec.members.iter().map(|m| m.node.as_str()).collect();
    set.into_iter().collect::<Vec<_>>().join(",")
}

pub(crate) async fn create_secret(ctx: &Context, pair: &HAPair, name: &str) -> Result<Option<Secret>, Error> {
    ctx.guard("Secret")?;
    let ns = &ctx.settings.namespace;
    let mut metadata = owned_meta(pair, name.to_owned(), ns);
    metadata.annotations = Some(BTreeMap::from([(KEY_MEMBERS.to_owned(), members_of(pair))]));
    let secret = Secret {
        metadata,
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([
            ("key".to_owned(), ByteString(model::random_key_hex()?.into_bytes())),
            ("keyId".to_owned(), ByteString(b"1".to_vec())),
        ])),
        ..Secret::default()
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    match api
        .create(&PostParams { field_manager: Some(manager::OPERATOR.to_owned()), ..PostParams::default() }, &secret)
        .await
    {
        Ok(s) => Ok(Some(s)),
        Err(e) if is_status(&e, 409) => Ok(None),
        Err(source) => {
            Err(Error::CreateSecret { namespace: ns.clone(), name: name.to_owned(), source: Box::new(source) })
        }
    }
}

/// Replaces the key Secret (compare-and-swap on its resourceVersion).
async fn replace_secret(ctx: &Context, secret: &Secret, what: &'static str) -> Result<Secret, Error> {
    ctx.guard("Secret")?;
    let ns = &ctx.settings.namespace;
    let name = secret.name_any();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    api.replace(
        &name,
        &PostParams { field_manager: Some(manager::OPERATOR.to_owned()), ..PostParams::default() },
        secret,
    )
    .await
    .map_err(|source| Error::UpdateSecret { namespace: ns.clone(), name, what, source: Box::new(source) })
}

/// Takes over the key Secret an earlier pair of the same name left (it is owned by an
/// HAPair that no longer exists, and the garbage collector would delete it — in a cluster
/// whose pair was deleted and re-created quickly, after the new pair's agents had started
/// with its key): owned by this pair from now on, with a fresh random key under the next
/// id, no previous key and this pair's members. The pair's agents start only once the
/// operator labelled the pair, which comes after this, so nobody signs with the old key.
pub(crate) async fn adopt_secret(ctx: &Context, pair: &HAPair, secret: &Secret) -> Result<Secret, Error> {
    let mut s = secret.clone();
    let old_id = secret_data(secret, "keyId").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let data = s.data.get_or_insert_with(BTreeMap::new);
    data.insert("key".to_owned(), ByteString(model::random_key_hex()?.into_bytes()));
    data.insert("keyId".to_owned(), ByteString((old_id.max(0) + 1).to_string().into_bytes()));
    data.remove("previousKey");
    data.remove("previousKeyId");
    let ann = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.remove(ROTATION_ID);
    ann.remove(ROTATION_STARTED);
    ann.insert(KEY_MEMBERS.to_owned(), members_of(pair));
    s.metadata.owner_references =
        crate::context::owned_meta(pair, s.name_any(), &ctx.settings.namespace).owner_references;
    s.metadata.managed_fields = None;
    replace_secret(ctx, &s, "take over an earlier pair's key Secret").await
}

/// Starts a rotation: a new random key with id + 1; the old one stays accepted as
/// `previousKey` until every member signs with the new one.
pub(crate) async fn start_rotation(
    ctx: &Context,
    pair: &HAPair,
    secret: &Secret,
    id: &str,
    now: Timestamp,
) -> Result<Secret, Error> {
    let mut s = secret.clone();
    let old_key = secret_data(secret, "key").unwrap_or_default();
    let old_id = secret_data(secret, "keyId").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    let data = s.data.get_or_insert_with(BTreeMap::new);
    data.insert("key".to_owned(), ByteString(model::random_key_hex()?.into_bytes()));
    data.insert("keyId".to_owned(), ByteString((old_id + 1).to_string().into_bytes()));
    data.insert("previousKey".to_owned(), ByteString(old_key.into_bytes()));
    data.insert("previousKeyId".to_owned(), ByteString(old_id.to_string().into_bytes()));
    let ann = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(ROTATION_ID.to_owned(), id.to_owned());
    ann.insert(ROTATION_STARTED.to_owned(), now.to_string());
    ann.insert(KEY_MEMBERS.to_owned(), members_of(pair));
    s.metadata.managed_fields = None;
    replace_secret(ctx, &s, "start a key rotation").await
}

pub(crate) async fn finish_rotation(ctx: &Context, secret: &Secret) -> Result<Secret, Error> {
    let mut s = secret.clone();
    if let Some(d) = s.data.as_mut() {
        d.remove("previousKey");
        d.remove("previousKeyId");
    }
    if let Some(a) = s.metadata.annotations.as_mut() {
        a.remove(ROTATION_ID);
        a.remove(ROTATION_STARTED);
    }
    s.metadata.managed_fields = None;
    replace_secret(ctx, &s, "finish a key rotation").await
}

pub(crate) async fn record_members(ctx: &Context, pair: &HAPair, secret: &Secret) -> Result<Secret, Error> {
    let mut s = secret.clone();
    s.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(KEY_MEMBERS.to_owned(), members_of(pair));
    s.metadata.managed_fields = None;
    replace_secret(ctx, &s, "record the members").await
}
