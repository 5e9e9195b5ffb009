"""Test support shared by the test tiers (not shipped in the product package).

``tests/`` is on ``sys.path`` under pytest (rootdir conftest) and in ``bench/`` scripts, so this
package imports as ``support``.
"""
