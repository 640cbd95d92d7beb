"""torch's module types grouped by family, from their public classes (torch's common base classes,
such as ``_BatchNorm`` or ``_DropoutNd``, are private and may move)."""

from torch import nn

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
         nn.ConvTranspose3d)
AVG_POOLS = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
             nn.AdaptiveAvgPool3d)
RESIZES = (nn.Upsample, nn.PixelShuffle, nn.PixelUnshuffle)
DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def batch_statistics(model: nn.Module) -> tuple[str, ...]:
    """Each module of ``model`` normalising with its batch's own statistics (BatchNorm in training
    mode, or without running statistics), as messages name it, e.g.
    ``module 'block.bn' (BatchNorm2d) in training mode`` (none for a model that is not a module,
    which its conversion refuses)."""
    if not isinstance(model, nn.Module):
        return ()
    found = []
    for name, m in model.named_modules():
        if isinstance(m, BATCH_NORMS) and (m.training or m.running_mean is None):
            kind = type(m).__name__
            where = f"module '{name}' ({kind})" if name else f"the model ({kind})"
            found.append(where + (" in training mode" if m.running_mean is not None else
                                  " without running statistics (track_running_stats=False)"))
    return tuple(found)

