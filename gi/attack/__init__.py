"""The label-first attack as a library: labels → features → image (docs/architecture.md "Data flow").

``recon`` is the optimisation loop (Lightning). Light imports only: the stages load on first use.
"""
