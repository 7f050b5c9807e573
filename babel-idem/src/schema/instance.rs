//! One view of a JSON value for the validator and the equality, over both
//! trees it reads: a [`serde_json::Value`] and the document-ordered tree of
//! [`super::text`]. Numbers are told apart as Python's JSON reading tells
//! them apart: an integer (`int`) or a float (`float`).

use serde_json::{Map, Value};

/// A JSON value as the validator sees it.
pub(super) enum Kind<'n, I: Instance> {
    Null,
    Bool(bool),
    /// An integer; always within the range of `i64` or `u64`.
    Int(i128),
    Float(f64),
    Str(&'n str),
    Array(&'n [I]),
    Object(&'n I::Object),
}

// A view is references and scalars, copied whatever `I` is.
impl<I: Instance> Clone for Kind<'_, I> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<I: Instance> Copy for Kind<'_, I> {}

/// A JSON tree whose nodes the validator can view.
pub(super) trait Instance: Sized {
    /// An object's members.
    type Object: Members<Self> + ?Sized;

    fn kind(&self) -> Kind<'_, Self>;
}

/// The members of an object, in the tree's order, each name once.
pub(super) trait Members<I: Instance> {
    fn member_count(&self) -> usize;

    fn member(&self, name: &str) -> Option<&I>;

    fn members<'a>(&'a self) -> impl Iterator<Item = (&'a str, &'a I)>
    where
        I: 'a;
}

impl Instance for Value {
    type Object = Map<String, Value>;

    fn kind(&self) -> Kind<'_, Self> {
        match self {
            Value::Null => Kind::Null,
            Value::Bool(b) => Kind::Bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => Kind::Int(u.into()),
                (None, Some(i)) => Kind::Int(i.into()),
                // Without `arbitrary_precision` every other number is an f64.
                (None, None) => Kind::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => Kind::Str(s),
            Value::Array(items) => Kind::Array(items),
            Value::Object(members) => Kind::Object(members),
        }
    }
}

impl Members<Value> for Map<String, Value> {
    fn member_count(&self) -> usize {
        self.len()
    }

    fn member(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }

    fn members<'a>(&'a self) -> impl Iterator<Item = (&'a str, &'a Value)>
    where
        Value: 'a,
    {
        self.iter().map(|(name, value)| (name.as_str(), value))
    }
}
