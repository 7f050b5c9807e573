//! The check: a value walked against its [`Rules`], stopping at the first
//! violation in the Python SDK's order (`const`, `enum`, then `type`; an
//! object's `required` names, then its members in the tree's order). The
//! walk allocates nothing; the path is written only for the violation.

use std::fmt::Write;

use super::compile::{Expect, Rules};
use super::equal::same;
use super::instance::{Instance, Kind, Members};
use super::violation::{Rule, Violation};

/// Where the walk is: a chain of frames on the walk's own stack.
#[derive(Clone, Copy)]
enum At<'a> {
    Root,
    Member(&'a At<'a>, &'a str),
    Item(&'a At<'a>, usize),
}

impl At<'_> {
    fn violation(&self, rule: Rule) -> Violation {
        let mut path = String::new();
        self.write(&mut path);
        Violation::new(path, rule)
    }

    /// Python's joins: a member is `name` under an empty path and
    /// `path.name` otherwise; an item is `path[i]`.
    fn write(&self, path: &mut String) {
        match *self {
            At::Root => {}
            At::Member(parent, name) => {
                parent.write(path);
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(name);
            }
            At::Item(parent, index) => {
                parent.write(path);
                // Writing to a String cannot fail.
                let _ = write!(path, "[{index}]");
            }
        }
    }
}

/// The first violation of `value` against `rules`, the value at the root.
pub(super) fn check<I: Instance>(rules: &Rules, value: Kind<'_, I>) -> Result<(), Violation> {
    walk(rules, value, &At::Root)
}

fn walk<I: Instance>(rules: &Rules, value: Kind<'_, I>, at: &At<'_>) -> Result<(), Violation> {
    if let Some(constant) = &rules.constant
        && !same(value, constant.kind())
    {
        return Err(at.violation(Rule::WrongConst));
    }
    if let Some(one_of) = &rules.one_of
        && !one_of.iter().any(|allowed| same(value, allowed.kind()))
    {
        return Err(at.violation(Rule::NotInEnum));
    }
    match &rules.expect {
        Expect::Anything => Ok(()),
        Expect::Object {
            required,
            properties,
            open,
        } => {
            let Kind::Object(object) = value else {
                return Err(at.violation(Rule::NotAnObject));
            };
            if let Some(missing) = required.iter().find(|name| object.member(name).is_none()) {
                return Err(At::Member(at, missing).violation(Rule::MissingRequired));
            }
            for (name, member) in object.members() {
                let here = At::Member(at, name);
                match properties.get(name) {
                    Some(rules) => walk(rules, member.kind(), &here)?,
                    None if !open => return Err(here.violation(Rule::AdditionalNotAllowed)),
                    None => {}
                }
            }
            Ok(())
        }
        Expect::Array { items } => {
            let Kind::Array(values) = value else {
                return Err(at.violation(Rule::NotAnArray));
            };
            if let Some(items) = items {
                for (index, item) in values.iter().enumerate() {
                    walk(items, item.kind(), &At::Item(at, index))?;
                }
            }
            Ok(())
        }
        Expect::String { min_length } => match value {
            Kind::Str(text) if (text.chars().count() as u64) < *min_length => {
                Err(at.violation(Rule::BelowMinLength))
            }
            Kind::Str(_) => Ok(()),
            _ => Err(at.violation(Rule::NotAString)),
        },
        Expect::Integer { minimum } => match value {
            Kind::Int(_) => at_least(value, *minimum, at),
            Kind::Float(f) if f.fract() == 0.0 => at_least(value, *minimum, at),
            _ => Err(at.violation(Rule::NotAnInteger)),
        },
        Expect::Number { minimum } => match value {
            Kind::Int(_) | Kind::Float(_) => at_least(value, *minimum, at),
            _ => Err(at.violation(Rule::NotANumber)),
        },
        Expect::Boolean => match value {
            Kind::Bool(_) => Ok(()),
            _ => Err(at.violation(Rule::NotABoolean)),
        },
        Expect::Null => match value {
            Kind::Null => Ok(()),
            _ => Err(at.violation(Rule::NotNull)),
        },
    }
}

/// `float(value) < float(minimum)` is a violation.
fn at_least<I: Instance>(
    value: Kind<'_, I>,
    minimum: Option<f64>,
    at: &At<'_>,
) -> Result<(), Violation> {
    let value = match value {
        Kind::Int(i) => i as f64,
        Kind::Float(f) => f,
        _ => return Ok(()),
    };
    match minimum {
        Some(minimum) if value < minimum => Err(at.violation(Rule::BelowMinimum)),
        _ => Ok(()),
    }
}
