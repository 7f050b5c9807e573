//! [`Registry`]: the schemas a babelqueue-registry manifest names, read
//! when it is opened.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use foldhash::fast::RandomState;
use serde_json::Value;

use super::definition::Schema;
use super::error::{SchemaError, what_is};
use super::provider::{SchemaProvider, Schemas};

/// The schemas of a babelqueue-registry manifest (`registry.json`):
/// `{"schemas": [{"urn": "...", "schema": "relative/file.json"}, ...]}`.
///
/// [`Registry::open`] reads the manifest and every schema file it names at
/// once, so lookups never touch the disk. The manifest is read as the
/// Python SDK's `DirProvider` reads it: an entry that is not an object with
/// a non-empty string `urn` and a non-empty string `schema` is skipped, a
/// `schemas` that is not an array names nothing, and a URN named twice
/// keeps its last entry (only the file in effect is read). A relative file
/// is found from the manifest's folder; an absolute one is read as it is.
///
/// ```
/// use babel_idem::schema::{Registry, SchemaProvider};
/// use serde_json::json;
/// use std::fs;
///
/// let dir = std::env::temp_dir().join(format!("babel-idem-registry-doc-{}", std::process::id()));
/// fs::create_dir_all(dir.join("orders"))?;
/// fs::write(dir.join("orders/created.json"), r#"{"type": "object", "required": ["order_id"]}"#)?;
/// fs::write(dir.join("registry.json"), r#"{"schemas": [
///     {"urn": "urn:babel:orders:created", "schema": "orders/created.json"}
/// ]}"#)?;
///
/// let registry = Registry::open(dir.join("registry.json"))?;
/// fs::remove_dir_all(&dir)?;
/// assert_eq!(registry.urns().collect::<Vec<_>>(), ["urn:babel:orders:created"]);
/// let violation = registry.check("urn:babel:orders:created", &json!({})).unwrap_err();
/// assert_eq!(violation.to_string(), "order_id: missing_required");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Registry {
    schemas: Schemas,
}

impl Registry {
    /// Reads the manifest at `manifest` and every schema file it names.
    ///
    /// ```no_run
    /// use babel_idem::schema::Registry;
    ///
    /// let registry = Registry::open("schemas/registry.json")?;
    /// println!("{} URNs with a schema", registry.urns().count());
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SchemaError::RegistryUnreadable`], [`SchemaError::RegistryNotJson`]
    /// or [`SchemaError::RegistryNotAnObject`] for the manifest;
    /// [`SchemaError::SchemaFileUnreadable`] or
    /// [`SchemaError::SchemaFileUnusable`], naming the file and its URN,
    /// for the first schema file (in manifest order) that is missing,
    /// unreadable or holds no usable schema.
    pub fn open(manifest: impl AsRef<Path>) -> Result<Registry, SchemaError> {
        let manifest = manifest.as_ref();
        let text = std::fs::read_to_string(manifest).map_err(|source| {
            SchemaError::RegistryUnreadable {
                path: manifest.to_owned(),
                source,
            }
        })?;
        let document: Value =
            serde_json::from_str(&text).map_err(|source| SchemaError::RegistryNotJson {
                path: manifest.to_owned(),
                source,
            })?;
        let Value::Object(document) = document else {
            return Err(SchemaError::RegistryNotAnObject {
                path: manifest.to_owned(),
                found: what_is(&document),
            });
        };
        let folder = manifest.parent().unwrap_or(Path::new(""));
        let mut schemas = Schemas::new();
        for (urn, file) in entries(&document) {
            let path = folder.join(file);
            schemas = schemas.with(urn, read_schema(urn, path)?);
        }
        Ok(Registry { schemas })
    }

    /// The URNs the manifest gives a schema, in no particular order.
    ///
    /// ```no_run
    /// use babel_idem::schema::Registry;
    ///
    /// for urn in Registry::open("schemas/registry.json")?.urns() {
    ///     println!("{urn}");
    /// }
    /// # Ok::<(), babel_idem::schema::SchemaError>(())
    /// ```
    pub fn urns(&self) -> impl Iterator<Item = &str> {
        self.schemas.urns()
    }
}

impl SchemaProvider for Registry {
    fn schema_for(&self, urn: &str) -> Option<&Schema> {
        self.schemas.schema_for(urn)
    }
}

/// The `(urn, file)` pairs of the manifest's `schemas`, each URN once: in
/// the place of its first entry, with the file of its last.
fn entries(document: &serde_json::Map<String, Value>) -> Vec<(&str, &str)> {
    let mut entries: Vec<(&str, &str)> = Vec::new();
    let Some(Value::Array(listed)) = document.get("schemas") else {
        return entries;
    };
    let mut place: HashMap<&str, usize, RandomState> = HashMap::default();
    for entry in listed {
        let (Some(Value::String(urn)), Some(Value::String(file))) =
            (entry.get("urn"), entry.get("schema"))
        else {
            continue;
        };
        if urn.is_empty() || file.is_empty() {
            continue;
        }
        match place.get(urn.as_str()) {
            Some(&index) => entries[index].1 = file,
            None => {
                place.insert(urn, entries.len());
                entries.push((urn, file));
            }
        }
    }
    entries
}

fn read_schema(urn: &str, path: PathBuf) -> Result<Schema, SchemaError> {
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => {
            return Err(SchemaError::SchemaFileUnreadable {
                urn: urn.to_owned(),
                path,
                source,
            });
        }
    };
    Schema::from_json(&text).map_err(|source| SchemaError::SchemaFileUnusable {
        urn: urn.to_owned(),
        path,
        source: Box::new(source),
    })
}
