"""profiles, events, audiences and computed traits; regulations and suppressions

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("traits", sa.Text(), nullable=False),
        sa.Column("trait_times", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_profiles_kind_id", "profiles", ["kind", "id"])

    op.create_table(
        "identities",
        sa.Column("alias_id", sa.Text(), primary_key=True),
        sa.Column("canonical_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_identities_canonical_id", "identities", ["canonical_id"])

    op.create_table(
        "events",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("identity", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("timestamp", sa.Float(), nullable=False),
        sa.Column("properties", sa.Text(), nullable=False),
    )
    op.create_index("ix_events_identity", "events", ["identity", "name", "timestamp"])
    op.create_index("ix_events_timestamp", "events", ["timestamp"])

    op.create_table(
        "computations",
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("definition_hash", sa.String(64), nullable=False),
        sa.Column("last_sync_at", sa.Float()),
        sa.Column("last_success_at", sa.Float()),
        sa.Column("last_sent", sa.Integer()),
        sa.Column("last_error", sa.Text()),
    )

    op.create_table(
        "computed_values",
        sa.Column("computation", sa.String(300), primary_key=True),
        sa.Column("profile_id", sa.Text(), primary_key=True),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_computed_values_profile_id", "computed_values", ["profile_id"])

    op.create_table(
        "regulations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("type", sa.String(24), nullable=False),
        sa.Column("scope", sa.String(200)),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("subject_count", sa.Integer(), nullable=False),
        sa.Column("progress", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("owner", sa.String(80)),
        sa.Column("lease_until", sa.Float()),
        sa.Column("lease_token", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("error", sa.Text()),
    )
    op.create_index("ix_regulations_status_created_at", "regulations", ["status", "created_at"])

    op.create_table(
        "regulation_subjects",
        sa.Column(
            "regulation_id",
            sa.String(40),
            sa.ForeignKey("regulations.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("subject_id", sa.Text(), primary_key=True),
        sa.Column("requested", sa.Integer(), nullable=False),
    )

    op.create_table(
        "suppressions",
        sa.Column("subject_id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("regulation_id", sa.String(40), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_suppressions_user_id", "suppressions", ["user_id"])


def downgrade() -> None:
    op.drop_table("suppressions")
    op.drop_table("regulation_subjects")
    op.drop_table("regulations")
    op.drop_table("computed_values")
    op.drop_table("computations")
    op.drop_table("events")
    op.drop_table("identities")
    op.drop_table("profiles")
