"""What people read: the HTML report, figures, tables, terminal text."""
