"""runners: see DESIGN.md. Arrives with its own issue."""
