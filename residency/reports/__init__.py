"""What people read: evidence tables, figures, notebook views, the banner and HTML reports with
screenshots."""
