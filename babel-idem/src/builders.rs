//! Builder methods that only store their argument.

/// Builder methods that each store their argument (or an expression of it,
/// after `=`) in one field and return the builder:
///
/// ```text
/// setters! {
///     /// Docs.
///     pub fn name(param: Type) => self.field;
///     pub fn other(param: Type) => self.other = Some(param);
/// }
/// ```
macro_rules! setters {
    ($(
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($param:ident: $ty:ty) => self.$field:ident $(= $value:expr)?;
    )+) => {
        $(
            $(#[$attr])*
            $vis fn $name(mut self, $param: $ty) -> Self {
                self.$field = setters!(@value $param $(, $value)?);
                self
            }
        )+
    };
    (@value $param:ident) => {
        $param
    };
    (@value $param:ident, $value:expr) => {
        $value
    };
}
pub(crate) use setters;
