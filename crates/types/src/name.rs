//! Names of volumes and pools.
//!
//! A name is 1 to 64 characters of `[A-Za-z0-9._-]`, starting with a letter or digit. The rule
//! keeps names safe as NBD export names, etcd key segments, file names and URL path segments.

use thiserror::Error;

/// The longest accepted name.
pub const MAX_NAME_LEN: usize = 64;

/// Why a name was rejected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NameError {
    #[error(
        "name is empty; use 1 to {MAX_NAME_LEN} characters of letters, digits, '.', '_' or '-'"
    )]
    Empty,
    #[error("name '{0}' is longer than {MAX_NAME_LEN} characters")]
    TooLong(String),
    #[error("name '{name}' contains '{ch}'; use only letters, digits, '.', '_' or '-'")]
    BadChar { name: String, ch: char },
    #[error("name '{0}' must start with a letter or a digit")]
    BadStart(String),
}

/// Checks a volume or pool name.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let Some(first) = name.chars().next() else {
        return Err(NameError::Empty);
    };
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(name.to_string()));
    }
    if let Some(ch) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::BadChar {
            name: name.to_string(),
            ch,
        });
    }
    if !first.is_ascii_alphanumeric() {
        return Err(NameError::BadStart(name.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_rejects() {
        assert_eq!(validate_name("vol-1.data_x"), Ok(()));
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert!(matches!(
            validate_name("a/b"),
            Err(NameError::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            validate_name("a b"),
            Err(NameError::BadChar { ch: ' ', .. })
        ));
        assert!(matches!(validate_name("-x"), Err(NameError::BadStart(_))));
        assert!(matches!(validate_name(".."), Err(NameError::BadStart(_))));
        assert!(matches!(
            validate_name(&"x".repeat(65)),
            Err(NameError::TooLong(_))
        ));
        assert_eq!(validate_name(&"x".repeat(64)), Ok(()));
        assert!(matches!(validate_name("é"), Err(NameError::BadChar { .. })));
    }
}
