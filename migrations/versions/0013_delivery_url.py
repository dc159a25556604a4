"""deliveries: url, the URL an action's request was rendered to at routing

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

An action of an actions destination (docs/actions.md) may have `{{field}}` templates in its
URL: the URL made for a message is stored with its delivery, beside the mapped body, so that
a retry, a restart, a redrive and a replay send the same request. NULL, every delivery of a
webhooks destination: the route's hook URLs. Adding a nullable column without a default
rewrites no rows on either backend.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("url", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("url")
