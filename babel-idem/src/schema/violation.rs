//! The first violation a check meets: where, and which rule.

use std::fmt;

/// The rule a value broke, one per reason the family's validators report.
///
/// [`Rule::as_str`] (and `Display`) give the reason as the Python SDK
/// writes it after the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// The value is not the schema's `const`.
    WrongConst,
    /// The value is none of the schema's `enum`.
    NotInEnum,
    /// `type: object`, and the value is not an object.
    NotAnObject,
    /// A name of the schema's `required` is not a member of the object.
    MissingRequired,
    /// A member the schema's `properties` do not name, under
    /// `additionalProperties: false`.
    AdditionalNotAllowed,
    /// `type: array`, and the value is not an array.
    NotAnArray,
    /// `type: string`, and the value is not a string.
    NotAString,
    /// A string with fewer characters (code points) than `minLength`.
    BelowMinLength,
    /// `type: integer`, and the value is not an integer (`1.0` is one; a
    /// boolean is not).
    NotAnInteger,
    /// `type: number`, and the value is not a number (a boolean is not).
    NotANumber,
    /// A number below `minimum`.
    BelowMinimum,
    /// `type: boolean`, and the value is not a boolean.
    NotABoolean,
    /// `type: null`, and the value is not `null`.
    NotNull,
}

crate::names::named_variants! {
    /// The reason as the Python SDK writes it: `wrong_const`,
    /// `not_in_enum`, `not_an_object`, `missing_required`,
    /// `additional_not_allowed`, `not_an_array`, `not_a_string`,
    /// `below_min_length`, `not_an_integer`, `not_a_number`,
    /// `below_minimum`, `not_a_boolean`, `not_null`.
    ///
    /// ```
    /// use babel_idem::schema::Rule;
    ///
    /// assert_eq!(Rule::AdditionalNotAllowed.as_str(), "additional_not_allowed");
    /// ```
    Rule {
        WrongConst => "wrong_const",
        NotInEnum => "not_in_enum",
        NotAnObject => "not_an_object",
        MissingRequired => "missing_required",
        AdditionalNotAllowed => "additional_not_allowed",
        NotAnArray => "not_an_array",
        NotAString => "not_a_string",
        BelowMinLength => "below_min_length",
        NotAnInteger => "not_an_integer",
        NotANumber => "not_a_number",
        BelowMinimum => "below_minimum",
        NotABoolean => "not_a_boolean",
        NotNull => "not_null",
    }
}

/// Where a value broke its schema, and which [`Rule`].
///
/// `Display` writes the Python SDK's text, `path: reason`, with `<root>`
/// for the empty path:
///
/// ```
/// use babel_idem::schema::{Rule, Schema};
/// use serde_json::json;
///
/// let schema = Schema::from_value(json!({
///     "type": "object",
///     "properties": {"lines": {"type": "array", "items": {
///         "type": "object", "required": ["sku"]
///     }}}
/// }))?;
/// let violation = schema.check(&json!({"lines": [{"sku": "a"}, {}]})).unwrap_err();
/// assert_eq!(violation.path(), "lines[1].sku");
/// assert_eq!(violation.rule(), Rule::MissingRequired);
/// assert_eq!(violation.to_string(), "lines[1].sku: missing_required");
/// # Ok::<(), babel_idem::schema::SchemaError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Violation {
    path: String,
    rule: Rule,
}

impl Violation {
    pub(super) fn new(path: String, rule: Rule) -> Self {
        Violation { path, rule }
    }

    /// The path of the value at fault: member names joined by `.`, array
    /// indexes as `[i]` (`lines[1].sku`); empty for the root.
    ///
    /// ```
    /// use babel_idem::schema::Schema;
    /// use serde_json::json;
    ///
    /// let schema = Schema::from_value(json!({"type": "object"}))?;
    /// assert_eq!(schema.check(&json!("text")).unwrap_err().path(), "");
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The rule the value broke.
    ///
    /// ```
    /// use babel_idem::schema::{Rule, Schema};
    /// use serde_json::json;
    ///
    /// let schema = Schema::from_value(json!({"type": "integer"}))?;
    /// assert_eq!(schema.check(&json!(true)).unwrap_err().rule(), Rule::NotAnInteger);
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn rule(&self) -> Rule {
        self.rule
    }
}

impl fmt::Display for Violation {
    /// `path: reason`, with `<root>` for the empty path.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "<root>"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.rule)
    }
}

impl std::error::Error for Violation {}
