"""The streaming side: query registrations and windows of rows → relQueries (Faust)."""
