//! Fieldless public enums named by a fixed word per variant.

/// `as_str`, the word of each variant as listed (with the docs given), and
/// a `Display` that writes it, for a fieldless enum `$enum`.
macro_rules! named_variants {
    ($(#[$doc:meta])* $enum:ident { $($variant:ident => $name:literal,)+ }) => {
        impl $enum {
            $(#[$doc])*
            pub fn as_str(self) -> &'static str {
                match self {
                    $($enum::$variant => $name,)+
                }
            }
        }

        impl std::fmt::Display for $enum {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use named_variants;
